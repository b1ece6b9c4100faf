"""Overload benchmark: people chatting and sending documents, arms side by side in one run.

    .venv/bin/python bench/load/overload.py --duration 10m --users 50 --save-results   # the verdict
    .venv/bin/python bench/load/overload.py --duration 2m --users 12                   # a validation run
    .venv/bin/python bench/load/overload.py --arms managed,replicas   # one process against replicas

Each arm starts its own `chainlit run app.py` (default model) on a free loopback port and runs
bench/load/overload_users.py under Locust for --duration, then stops both by itself. An arm is the
app's settings and how people behave (overload_users.py, --pattern):
    fcfs     today's behaviour: first come, first served, everything admitted at once, no limits;
             patient people (a few turns a session, 5-15 s after a refusal, some documents)
    managed  the defaults (chat before documents, admission at a reading pace, a bounded queue that
             shows each person their place, per-person limits), patient people
    storm    the defaults; chat only, each person resends 0.1-0.5 s after every answer or refusal,
             a fifth of turns close their page at the first token
    think    the defaults; the storm's people with 2-8 s of thought instead
    replicas the managed arm's people and settings through deploy/topology.py's scale-out: HAProxy
             (sticky cookie) -> 2 app replicas -> vLLM's router -> `vllm serve` with the in-process
             engine's defaults (--engine-servers, 1 by default: two on 2 cores share the same
             cores; bench/load/deployments.py says why), one PostgreSQL; each person has an account of
             their own, signed in before the load (browsers keep a sign-in across visits: the
             load measures chatting, not 50 argon2 checks at once), and stays on one replica by
             the balancer's cookie
Per arm: time to first token of accepted chat turns, tokens/s per stream, answers finished,
refusals and how fast they were told, how long a page took to open, tokens delivered to people,
document completion time, total tokens/s (vLLM's own counters), the longest wait without any
update, the cores each part of the machine used during the load (engine processes, apps, router,
balancer, database, Locust: what two cores give each tier), and what the app holds after the load
(engine requests, sessions, memory of its process tree; for replicas their sum and each one's, and
the engine servers' requests and memory), and what admission did during it (bench/load/timeline.py:
requests run, the limit and which bound set it, every 10 s). Writes
to --out (default bench/out/overload-<time>): summary.json (one object per arm, the targets; with
managed and replicas both, replicas_vs_managed), overload.png (TTFT over time, one panel per arm),
turns-<arm>.csv, admission-<arm>.jsonl, server-<arm>.log (replicas: <arm>-logs/), locust-<arm>.log.
--save-results copies the summary and plot to bench/results/load/overload-summary-<date-time>.json and
overload-ttft-<date-time>.png.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import resource
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.common import (
    cores_by_part,
    cpu_seconds_by_part,
    machine_info,
    parse_duration,
    percentile,
    result_path,
)
from bench.load.deployments import (
    INTER_TOKEN,
    PASSWORD_ENV,
    Deployment,
    combined_status,
    marked_down,
    signed_in_cookies,
    start_replicas,
    start_single,
)
from bench.load.timeline import AdmissionTimeline

FCFS_SETTINGS = {
    "PRIORITY_SCHEDULING": "false",
    "READING_PACE_TOKENS_PER_SECOND": "0",
    "MAX_NUM_QUEUED_REQS": "0",
    "USER_MAX_CONCURRENT_TURNS": "0",
    "USER_TOKENS_PER_MINUTE": "0",
    "USER_DOCUMENTS_PER_HOUR": "0",
    "LONG_PREFILL_TOKEN_THRESHOLD": "0",
}


@dataclass(frozen=True)
class Arm:
    """The app's settings (beside the defaults) and how its people behave."""

    settings: dict[str, str]
    pattern: str = "patient"
    documents: bool = True
    leave_after_first_token: float = 0.0
    max_new_tokens: int = 64  # the answer budget each page sets; 0 = the app's default (MAX_NEW_TOKENS)
    deployment: str = "single"  # or "replicas" (bench/load/deployments.py)


ARMS = {
    "fcfs": Arm(FCFS_SETTINGS),
    "managed": Arm({}),
    "storm": Arm({}, "storm", documents=False, leave_after_first_token=0.2, max_new_tokens=0),
    "think": Arm({}, "think", documents=False, leave_after_first_token=0.2, max_new_tokens=0),
    "replicas": Arm({}, deployment="replicas"),
}
PATIENT_ARM = "managed"  # the storm arms' tokens are compared with this one's
MAX_WAIT_SECONDS = 10.0  # ADMISSION_MAX_WAIT_SECONDS's default, which every arm but fcfs runs with
TARGETS = {
    "chat_ttft_p95_seconds_max": MAX_WAIT_SECONDS,  # patient people
    "storm_chat_ttft_p95_seconds_max": MAX_WAIT_SECONDS + 2,
    "storm_chat_ttft_p99_seconds_max": 2 * MAX_WAIT_SECONDS,
    "stream_tokens_per_second_p5_min": 5.0,
    "refusal_told_seconds_max": 1.0,  # patient people: every refusal
    "storm_refusal_told_p99_seconds_max": 1.0,
    "connect_p95_seconds_max": 1.0,
    "total_generation_vs_fcfs_min": 0.9,
    "delivered_vs_patient_min": 0.9,
    "max_silence_seconds_max": 2.0,
    "memory_after_vs_before_mb_max": 20.0,
    "nothing_held_max": 0,
}
SETTLE_SECONDS = 30.0  # after the load: the engine's last requests end, maintenance runs


HELD = ("engine_unfinished_requests", "sessions", "sessions_awaiting_reconnect", "turns_in_flight")


def after_load(deployment: Deployment) -> dict[str, Any]:
    """What the app holds once the people left and SETTLE_SECONDS passed: summed over replicas, each
    replica's, and the engine servers' own running and waiting requests."""
    time.sleep(SETTLE_SECONDS)
    statuses = deployment.statuses()
    combined = combined_status(statuses)
    rss = deployment.rss_mb()
    held = {**{name: combined[name] for name in HELD}, "tree_rss_mb": round(sum(rss.values()), 1)}
    if len(statuses) > 1 or deployment.engines:
        held["tree_rss_mb_by_part"] = rss
        held["engine_server_requests_held"] = deployment.engine_requests_held()
        held["each_replica"] = [{name: status.get(name) for name in HELD} for status in statuses]
    return held


def locust_command(
    arm: Arm, options: argparse.Namespace, url: str, out: Path, name: str, accounts: str, cookies: str = ""
) -> list:
    users_file = ROOT / "bench" / "load" / "overload_users.py"
    documents = options.document_fraction if arm.documents else 0
    return [
        str(Path(sys.executable).with_name("locust")),
        "-f",
        str(users_file),
        "--headless",
        "-u",
        str(options.users),
        "-r",
        str(options.spawn_rate),
        "-t",
        f"{int(options.duration)}s",
        "--host",
        url,
        "--turns-csv",
        str(out / f"turns-{name}.csv"),
        "--stop-timeout",
        "5",
        "--only-summary",
        "--document-fraction",
        str(documents),
        "--turn-timeout",
        str(options.turn_timeout),
        "--pattern",
        arm.pattern,
        "--leave-after-first-token",
        str(arm.leave_after_first_token),
        "--max-new-tokens",
        str(arm.max_new_tokens),
        "--accounts",
        accounts,
        "--logfile",
        str(out / f"locust-{name}.log"),
        "--cookies",
        cookies,
    ]


def deploy(name: str, arm: Arm, options: argparse.Namespace, out: Path) -> Deployment:
    if arm.deployment == "replicas":
        return start_replicas(
            arm.settings, out / f"{name}-logs", options.users, options.engine_servers, options.app_replicas
        )
    return start_single(arm.settings, out / f"server-{name}.log")


def sign_in_before(name: str, options: argparse.Namespace, out: Path, deployment: Deployment) -> str:
    """With accounts, everyone's sign-in made before the load, in a file for Locust ("" without)."""
    if not deployment.accounts:
        return ""
    cookies = signed_in_cookies(deployment.url, deployment.accounts, options.users, deployment.password)
    path = out / f"cookies-{name}.json"
    path.write_text(json.dumps(cookies))
    return str(path)


def load(
    name: str, arm: Arm, options: argparse.Namespace, out: Path, deployment: Deployment, cookies: str
) -> None:
    """Locust's people against the deployment for --duration (the accounts' password in its env only)."""
    env = {**os.environ, PASSWORD_ENV: deployment.password}
    command = locust_command(arm, options, deployment.url, out, name, deployment.accounts, cookies)
    with (out / f"locust-{name}.out").open("wb") as log:
        subprocess.run(
            command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=options.duration + 180
        )


def run_arm(name: str, options: argparse.Namespace, out: Path) -> dict[str, Any]:
    """Start the app with the arm's settings, load it, stop it; return what was measured."""
    arm = ARMS[name]
    started = time.monotonic()
    deployment = deploy(name, arm, options, out)
    start_seconds = time.monotonic() - started
    try:
        cookies = sign_in_before(name, options, out, deployment)
        warm_up = one_or_each([s.get("warm_up") for s in deployment.statuses()])
        rss_before = deployment.rss_mb()
        rows_before = deployment.stored_rows()
        cpu_before = deployment.app_cpu_seconds()
        before = deployment.counters()
        began = time.monotonic()
        logged = len(deployment.balancer_log())
        machine_cpu, load_cpu = cpu_seconds_by_part(), children_cpu_seconds()
        with AdmissionTimeline(deployment.statuses, out / f"admission-{name}.jsonl") as timeline:
            load(name, arm, options, out, deployment, cookies)
        after = deployment.counters()
        elapsed = time.monotonic() - began
        cores = cores_by_part(machine_cpu, cpu_seconds_by_part(), elapsed)
        cores["load"] = round(cores.get("load", 0.0) + (children_cpu_seconds() - load_cpu) / elapsed, 2)
        downs = marked_down(deployment.balancer_log()[logged:])
        cpu = deployment.app_cpu_seconds() - cpu_before
        rows = deployment.stored_rows()
        status = combined_status(deployment.statuses())
        held = after_load(deployment)
    finally:
        deployment.stop()
    turns = read_turns(out / f"turns-{name}.csv")
    summary = summarize(turns, options.turn_timeout, elapsed)
    asked = max(1, summary["turns"])
    summary["app_cost_per_turn"] = {
        "cpu_ms": round(1000 * cpu / asked, 1),
        **{f"{table}_stored": round((rows[table] - rows_before[table]) / asked, 2) for table in rows},
    }
    grown = {name: after[name] - before[name] for name in after}
    generated, prompted = grown["vllm:generation_tokens_total"], grown["vllm:prompt_tokens_total"]
    gaps, gap_seconds = grown[f"{INTER_TOKEN}_count"], grown[f"{INTER_TOKEN}_sum"]
    summary.update(
        {
            "arm": name,
            **asdict(arm),
            "load_seconds": round(elapsed, 1),
            "start_seconds": round(start_seconds, 1),
            "warm_up": warm_up,
            "total_generation_tokens_per_second": round(generated / elapsed, 2),
            "total_prompt_tokens_per_second": round(prompted / elapsed, 2),
            # what the engine itself did: prompt tokens it computed (not from its prefix cache), and the
            # mean time between two tokens of a request, measured inside the engine (no HTTP, no app)
            "prompt_tokens_computed_per_second": round(
                (prompted - grown["vllm:prompt_tokens_cached_total"]) / elapsed, 2
            ),
            "engine_inter_token_seconds_mean": round(gap_seconds / gaps, 4) if gaps else None,
            "refusals_counted_in_metrics": grown["chat_admission_refusals_total"],
            "admission_at_end": status["admission"],
            "event_loop_lag_max_seconds": status["event_loop_lag_max_seconds"],
            "admission_timeline": timeline.summary(),  # means over the load; admission-<arm>.jsonl has each
            "cores_used_by_part": cores,  # of the machine's, on average over the load (Locust: "load")
            "sessions_dropped_total": status["sessions_dropped_total"],
            "after_load": {**held, "tree_rss_mb_before": round(sum(rss_before.values()), 1)},
        }
    )
    if len(deployment.apps) > 1:
        summary["engine_servers"] = len(deployment.engines)
        summary["app_replicas"] = len(deployment.apps)
        summary["turns_by_replica"] = turns_by_replica(turns)
        summary["balancer_marked_down"] = downs  # during the load; a replica's pages cut each time
    return summary


def children_cpu_seconds() -> float:
    """CPU seconds of this process's children that ended (Locust's, when the load is over)."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def one_or_each(values: list[Any]) -> Any:
    return values[0] if len(values) == 1 else values


def turns_by_replica(turns: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """Turns and people on each replica, by the sticky cookie the people's browsers kept."""
    replicas = sorted({t.get("replica") or "?" for t in turns})
    return {
        r: {
            "turns": sum((t.get("replica") or "?") == r for t in turns),
            "people": len({t["user"] for t in turns if (t.get("replica") or "?") == r}),
        }
        for r in replicas
    }


def read_turns(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    with path.open() as file:
        return list(csv.DictReader(file))


def number(row: dict[str, Any], column: str) -> float | None:
    return float(row[column]) if row.get(column) not in (None, "") else None


def spread(values: list[float], *qs: int) -> dict[str, float | None]:
    return {f"p{q}": (round(v, 3) if (v := percentile(values, q)) is not None else None) for q in qs}


def summarize(turns: list[dict[str, Any]], timeout: float, elapsed: float) -> dict[str, Any]:
    """The report for one arm, from the turns as the people saw them."""
    chats = [t for t in turns if t["kind"] == "chat"]
    connects = [v for t in turns if (v := number(t, "connect_seconds")) is not None]
    delivered = sum(int(t["tokens"] or 0) for t in turns if t["outcome"] != "refused")
    documents = [t for t in turns if t["kind"] == "document"]
    accepted = [t for t in turns if t["outcome"] != "refused"]
    refused = [t for t in turns if t["outcome"] == "refused"]
    rates = [
        (float(t["tokens"]) - 1) / s
        for t in chats
        if t["outcome"] == "answered" and int(t["tokens"]) >= 8 and (s := number(t, "stream_seconds"))
    ]
    silences = [v for t in turns if (v := number(t, "max_silence_seconds")) is not None]
    told = [v for t in refused if (v := number(t, "told_seconds")) is not None]
    return {
        "turns": len(turns),
        "chat_turns": len(chats),
        "document_turns": len(documents),
        "chat_ttft_seconds": spread(
            [v for t in chats if (v := number(t, "ttft_seconds")) is not None], 50, 95, 99
        ),
        "stream_tokens_per_second": spread(rates, 5, 50),
        "answers_finished_share": round(
            sum(t["outcome"] == "answered" for t in accepted)
            / max(1, sum(t["outcome"] != "left" for t in accepted)),
            3,
        ),
        "unfinished_after_timeout": sum(t["outcome"] == "timeout" for t in accepted),
        "connection_lost": sum(t["outcome"] == "connection_lost" for t in accepted),
        "failed": sum(t["outcome"] == "failed" for t in accepted),
        "refused_share": round(len(refused) / max(1, len(turns)), 3),
        "refused_by_reason": {
            r: sum(t["refused_reason"] == r for t in refused)
            for r in sorted({t["refused_reason"] for t in refused})
        },
        "refusal_told_seconds": {**spread(told, 50, 95, 99), "max": round(max(told), 3) if told else None},
        "connect_seconds": spread(connects, 50, 95, 99),
        "connects": len(connects),
        "left_at_first_token": sum(t["outcome"] == "left" for t in accepted),
        "tokens_delivered_per_second": round(delivered / elapsed, 2) if elapsed else None,
        "document_completion_seconds": spread(
            [
                v
                for t in documents
                if t["outcome"] == "answered" and (v := number(t, "total_seconds")) is not None
            ],
            50,
            95,
        ),
        "max_silence_seconds": round(max(silences), 3) if silences else None,
        "silence_seconds": spread(silences, 50, 99),
        "turn_timeout_seconds": timeout,
    }


def check(value: float | None, target: str, none_meets: bool = False) -> dict[str, Any]:
    """`value` against TARGETS[target] (a bound from above for *_max, from below for *_min); no value
    meets it only where nothing to measure is fine (no refusal told)."""
    limit = TARGETS[target]
    if value is None:
        return {"value": None, "limit": limit, "met": none_meets}
    return {
        "value": value,
        "limit": limit,
        "met": value <= limit if target.endswith("_max") else value >= limit,
    }


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    return round(numerator / denominator, 3) if numerator is not None and denominator else None


def patient_checks(arm: dict[str, Any]) -> dict[str, Any]:
    """Patient people's targets (the managed arm's, and the same through the replicas)."""
    return {
        "chat_ttft_p95_seconds": check(arm["chat_ttft_seconds"]["p95"], "chat_ttft_p95_seconds_max"),
        "stream_tokens_per_second_p5": check(
            arm["stream_tokens_per_second"]["p5"], "stream_tokens_per_second_p5_min"
        ),
        "refusal_told_seconds_max": check(
            arm["refusal_told_seconds"]["max"], "refusal_told_seconds_max", none_meets=True
        ),
        "max_silence_seconds": check(arm["max_silence_seconds"], "max_silence_seconds_max"),
        "connect_p95_seconds": check(arm["connect_seconds"]["p95"], "connect_p95_seconds_max"),
    }


def held_checks(after: dict[str, Any]) -> dict[str, Any]:
    """Nothing held after the load: engine requests and turns (summed over replicas), and the engine
    servers' own running and waiting requests where there are engine servers."""
    checks = {
        "unfinished_engine_requests_after": check(after["engine_unfinished_requests"], "nothing_held_max"),
        "turns_in_flight_after": check(after["turns_in_flight"], "nothing_held_max"),
    }
    if "engine_server_requests_held" in after:
        checks["engine_server_requests_after"] = check(
            after["engine_server_requests_held"], "nothing_held_max"
        )
    return checks


def verdict(arms: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The targets: patient people on the managed arm (throughput against fcfs) and through the
    replicas (and nothing held there after the load), and the storm and think arms (tokens
    delivered against the managed arm's, and what is held after the load)."""
    checks: dict[str, Any] = {}
    managed, fcfs = arms.get("managed"), arms.get("fcfs")
    if managed is not None:
        checks["managed"] = patient_checks(managed)
        if fcfs is not None:
            checks["managed"]["total_generation_vs_fcfs"] = check(
                ratio(
                    managed["total_generation_tokens_per_second"], fcfs["total_generation_tokens_per_second"]
                ),
                "total_generation_vs_fcfs_min",
            )
    if (replicas := arms.get("replicas")) is not None:
        checks["replicas"] = {**patient_checks(replicas), **held_checks(replicas["after_load"])}
    for name in ("storm", "think"):
        if (arm := arms.get(name)) is None:
            continue
        after = arm["after_load"]
        checks[name] = {
            "chat_ttft_p95_seconds": check(
                arm["chat_ttft_seconds"]["p95"], "storm_chat_ttft_p95_seconds_max"
            ),
            "chat_ttft_p99_seconds": check(
                arm["chat_ttft_seconds"]["p99"], "storm_chat_ttft_p99_seconds_max"
            ),
            "refusal_told_p99_seconds": check(
                arm["refusal_told_seconds"]["p99"], "storm_refusal_told_p99_seconds_max", none_meets=True
            ),
            "connect_p95_seconds": check(arm["connect_seconds"]["p95"], "connect_p95_seconds_max"),
            "stream_tokens_per_second_p5": check(
                arm["stream_tokens_per_second"]["p5"], "stream_tokens_per_second_p5_min"
            ),
            "unfinished_engine_requests_after": check(
                after["engine_unfinished_requests"], "nothing_held_max"
            ),
            "turns_in_flight_after": check(after["turns_in_flight"], "nothing_held_max"),
            "memory_after_vs_before_mb": check(
                round(after["tree_rss_mb"] - after["tree_rss_mb_before"], 1), "memory_after_vs_before_mb_max"
            ),
        }
        if managed is not None:
            checks[name]["delivered_vs_patient"] = check(
                ratio(arm["tokens_delivered_per_second"], managed["tokens_delivered_per_second"]),
                "delivered_vs_patient_min",
            )
    return checks


def side_by_side(replicas: dict[str, Any], managed: dict[str, Any]) -> dict[str, Any]:
    """What the replicas' tiers cost against one process (no target: for reading)."""
    return {
        "tokens_delivered_per_second_ratio": ratio(
            replicas["tokens_delivered_per_second"], managed["tokens_delivered_per_second"]
        ),
        "total_generation_tokens_per_second_ratio": ratio(
            replicas["total_generation_tokens_per_second"], managed["total_generation_tokens_per_second"]
        ),
        "chat_ttft_p95_seconds": [replicas["chat_ttft_seconds"]["p95"], managed["chat_ttft_seconds"]["p95"]],
        "app_cpu_ms_per_turn": [
            replicas["app_cost_per_turn"]["cpu_ms"],
            managed["app_cost_per_turn"]["cpu_ms"],
        ],
        "order": ["replicas", "managed"],
    }


def plot(out: Path, names: list[str]) -> Path:
    """TTFT of each chat turn over the run, one panel per arm, refusals marked where they were told."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(names), figsize=(7 * len(names), 4.5), sharey=True, squeeze=False)
    for axis, name in zip(axes[0], names, strict=True):
        turns = read_turns(out / f"turns-{name}.csv")
        start = min((float(t["sent_unix"]) for t in turns), default=0.0)
        for kind, color in (("chat", "tab:blue"), ("document", "tab:green")):
            points = [
                ((float(t["sent_unix"]) - start) / 60, float(t["ttft_seconds"]))
                for t in turns
                if t["kind"] == kind and t["ttft_seconds"]
            ]
            axis.scatter(
                [p[0] for p in points],
                [p[1] for p in points],
                s=8,
                color=color,
                alpha=0.6,
                label=f"{kind}: first token",
            )
        told = [
            ((float(t["sent_unix"]) - start) / 60, float(t["told_seconds"]))
            for t in turns
            if t["told_seconds"]
        ]
        axis.scatter(
            [p[0] for p in told],
            [p[1] for p in told],
            s=14,
            marker="x",
            color="tab:red",
            label="refused: told after",
        )
        axis.axhline(
            TARGETS["chat_ttft_p95_seconds_max"],
            color="gray",
            linestyle="--",
            linewidth=1,
            label=f"{MAX_WAIT_SECONDS:.0f} s: ADMISSION_MAX_WAIT_SECONDS",
        )
        axis.set_yscale("log")
        axis.set_title(name)
        axis.set_xlabel("minutes into the arm (turn sent)")
        axis.grid(alpha=0.3)
    axes[0][0].set_ylabel("seconds after sending")
    axes[0][-1].legend(
        loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8
    )  # beside the plot, not on its points
    figure.tight_layout()
    path = out / "overload.png"
    figure.savefig(path, dpi=110)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--duration", type=parse_duration, default=parse_duration("10m"), help="Load per arm."
    )
    parser.add_argument("--users", type=int, default=50)
    parser.add_argument("--spawn-rate", type=float, default=5.0)
    parser.add_argument("--document-fraction", type=float, default=0.1)
    parser.add_argument("--turn-timeout", type=float, default=300.0)
    parser.add_argument(
        "--arms", default="fcfs,managed,storm,think", help="Comma-separated, run in this order."
    )
    parser.add_argument(
        "--engine-servers", type=int, default=1, help="`vllm serve` behind the router (replicas arm)."
    )
    parser.add_argument(
        "--app-replicas", type=int, default=2, help="App replicas behind the balancer (replicas arm)."
    )
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--save-results", action="store_true", help="Copy summary and plot to bench/results/load/."
    )
    options = parser.parse_args()
    out = options.out or ROOT / "bench" / "out" / f"overload-{datetime.now():%Y%m%d-%H%M%S}"
    out.mkdir(parents=True, exist_ok=True)
    names = [n.strip() for n in options.arms.split(",") if n.strip()]
    report: dict[str, Any] = {"run": {"command": " ".join(sys.argv), "machine_before": machine_info()}}
    for name in names:
        print(f"arm {name}: starting", flush=True)
        report[name] = run_arm(name, options, out)
        print(json.dumps(report[name], indent=1), flush=True)
    report["run"]["machine_after"] = machine_info()
    report["targets"] = verdict({n: report[n] for n in names})
    if "managed" in names and "replicas" in names:
        report["replicas_vs_managed"] = side_by_side(report["replicas"], report["managed"])
    (out / "summary.json").write_text(json.dumps(report, indent=2))
    picture = plot(out, names)
    print(json.dumps(report["targets"], indent=1))
    print(f"wrote {out / 'summary.json'} and {picture}")
    if options.save_results:
        now = datetime.now()
        result_path("load", "overload-summary", at=now).write_text(json.dumps(report, indent=2))
        result_path("load", "overload-ttft", ".png", at=now).write_bytes(picture.read_bytes())


if __name__ == "__main__":
    main()
