"""Overload benchmark: people chatting and sending documents, two arms side by side in one run.

    .venv/bin/python bench/load/overload.py --duration 10m --users 50 --save-results   # the verdict (~28 min)
    .venv/bin/python bench/load/overload.py --duration 2m --users 12                   # a validation run

Each arm starts its own `chainlit run app.py` (default model) on a free loopback port and runs
bench/load/overload_users.py under Locust for --duration, then stops both by itself:
    fcfs     today's behaviour: first come, first served, everything admitted at once, no limits
    managed  the defaults: chat before documents, admission at a reading pace, a bounded queue
             that shows each person their place, per-person limits
Per arm: time to first token of accepted chat turns, tokens/s per stream, answers finished,
refusals and how fast they were told, document completion time, total tokens/s (vLLM's own
counters), the longest wait without any update. Writes to --out (default bench/out/overload-<time>):
summary.json (one object per arm, the targets), overload.png (TTFT over time, both arms),
turns-<arm>.csv, server-<arm>.log, locust-<arm>.log. --save-results copies the summary and plot to
bench/results/load/overload-summary-<date-time>.json and overload-ttft-<date-time>.png.
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import time
import urllib.request
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.common import machine_info, parse_duration, percentile, result_path
from harness.server import AppServer

ARMS: dict[str, dict[str, str]] = {
    "fcfs": {
        "PRIORITY_SCHEDULING": "false", "READING_PACE_TOKENS_PER_SECOND": "0", "MAX_NUM_QUEUED_REQS": "0",
        "USER_MAX_CONCURRENT_TURNS": "0", "USER_TOKENS_PER_MINUTE": "0", "USER_DOCUMENTS_PER_HOUR": "0",
        "LONG_PREFILL_TOKEN_THRESHOLD": "0",
    },
    "managed": {},
}  # fmt: skip
COUNTERS = ("vllm:generation_tokens_total", "vllm:prompt_tokens_total", "chat_admission_refusals_total")
TARGETS = {
    "chat_ttft_p95_seconds_max": 10.0,
    "stream_tokens_per_second_p5_min": 5.0,
    "refusal_told_seconds_max": 1.0,
    "total_generation_vs_fcfs_min": 0.9,
    "max_silence_seconds_max": 2.0,
}


def scrape(url: str) -> dict[str, float]:
    """vLLM's token counters and our refusal counter, summed over labels."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        text = response.read().decode()
    values = dict.fromkeys(COUNTERS, 0.0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in values:
                values[sample.name] += sample.value
    return values


def run_arm(name: str, options: argparse.Namespace, out: Path) -> dict[str, Any]:
    """Start the app with the arm's settings, load it, stop it; return what was measured."""
    started = time.monotonic()
    server = AppServer(ARMS[name], out / f"server-{name}.log").start(timeout=900)
    start_seconds = time.monotonic() - started
    turns_csv = out / f"turns-{name}.csv"
    try:
        warm_up = server.status().get("warm_up")
        before, began = scrape(server.base_url), time.monotonic()
        command = [
            str(Path(sys.executable).with_name("locust")),
            "-f",
            str(ROOT / "bench" / "load" / "overload_users.py"),
            "--headless",
            "-u",
            str(options.users),
            "-r",
            str(options.spawn_rate),
            "-t",
            f"{int(options.duration)}s",
            "--host",
            server.base_url,
            "--turns-csv",
            str(turns_csv),
            "--stop-timeout",
            "5",
            "--only-summary",
            "--document-fraction",
            str(options.document_fraction),
            "--turn-timeout",
            str(options.turn_timeout),
            "--logfile",
            str(out / f"locust-{name}.log"),
        ]
        with (out / f"locust-{name}.out").open("wb") as log:
            subprocess.run(
                command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, timeout=options.duration + 180
            )
        after, elapsed = scrape(server.base_url), time.monotonic() - began
        status = server.status()
    finally:
        server.stop()
    summary = summarize(read_turns(turns_csv), options.turn_timeout)
    generated = after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"]
    prompted = after["vllm:prompt_tokens_total"] - before["vllm:prompt_tokens_total"]
    summary.update(
        {
            "arm": name,
            "settings": ARMS[name],
            "load_seconds": round(elapsed, 1),
            "start_seconds": round(start_seconds, 1),
            "warm_up": warm_up,
            "total_generation_tokens_per_second": round(generated / elapsed, 2),
            "total_prompt_tokens_per_second": round(prompted / elapsed, 2),
            "refusals_counted_in_metrics": after["chat_admission_refusals_total"]
            - before["chat_admission_refusals_total"],
            "admission_at_end": status.get("admission"),
            "event_loop_lag_max_seconds": status.get("event_loop_lag_max_seconds"),
            "sessions_dropped_total": status.get("sessions_dropped_total"),
        }
    )
    return summary


def read_turns(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    with path.open() as file:
        return list(csv.DictReader(file))


def number(row: dict[str, Any], column: str) -> float | None:
    return float(row[column]) if row.get(column) not in (None, "") else None


def spread(values: list[float], *qs: int) -> dict[str, float | None]:
    return {f"p{q}": (round(v, 3) if (v := percentile(values, q)) is not None else None) for q in qs}


def summarize(turns: list[dict[str, Any]], timeout: float) -> dict[str, Any]:
    """The report for one arm, from the turns as the people saw them."""
    chats = [t for t in turns if t["kind"] == "chat"]
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
            sum(t["outcome"] == "answered" for t in accepted) / max(1, len(accepted)), 3
        ),
        "unfinished_after_timeout": sum(t["outcome"] == "timeout" for t in accepted),
        "connection_lost": sum(t["outcome"] == "connection_lost" for t in accepted),
        "failed": sum(t["outcome"] == "failed" for t in accepted),
        "refused_share": round(len(refused) / max(1, len(turns)), 3),
        "refused_by_reason": {
            r: sum(t["refused_reason"] == r for t in refused)
            for r in sorted({t["refused_reason"] for t in refused})
        },
        "refusal_told_seconds": {**spread(told, 50, 100), "max": round(max(told), 3) if told else None},
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


def verdict(arms: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The targets, checked on the managed arm (throughput against the fcfs arm)."""
    managed, fcfs = arms.get("managed"), arms.get("fcfs")
    if managed is None:
        return {}
    ttft_p95 = managed["chat_ttft_seconds"]["p95"]
    stream_p5 = managed["stream_tokens_per_second"]["p5"]
    told_max = managed["refusal_told_seconds"]["max"]
    ratio = (
        managed["total_generation_tokens_per_second"] / fcfs["total_generation_tokens_per_second"]
        if fcfs and fcfs["total_generation_tokens_per_second"]
        else None
    )
    checks = {
        "chat_ttft_p95_seconds": (
            ttft_p95,
            ttft_p95 is not None and ttft_p95 <= TARGETS["chat_ttft_p95_seconds_max"],
        ),
        "stream_tokens_per_second_p5": (
            stream_p5,
            stream_p5 is not None and stream_p5 >= TARGETS["stream_tokens_per_second_p5_min"],
        ),
        "refusal_told_seconds_max": (
            told_max,
            told_max is None or told_max <= TARGETS["refusal_told_seconds_max"],
        ),
        "total_generation_vs_fcfs": (
            ratio and round(ratio, 3),
            ratio is not None and ratio >= TARGETS["total_generation_vs_fcfs_min"],
        ),
        "max_silence_seconds": (
            managed["max_silence_seconds"],
            (managed["max_silence_seconds"] or 0) <= TARGETS["max_silence_seconds_max"],
        ),
    }
    return {name: {"value": value, "met": met} for name, (value, met) in checks.items()}


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
            label="10 s target (P95)",
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
    parser.add_argument("--arms", default="fcfs,managed", help="Comma-separated, run in this order.")
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
