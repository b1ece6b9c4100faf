"""Soak test: start the app, load it with Locust, sample memory, write a report.

    .venv/bin/python bench/memory/soak.py --duration 30m --users 50 --vanish-fraction 0.2

Starts `chainlit run app.py` on a free loopback port (settings as env vars),
runs locustfile.py headless for --duration, samples the memory of the whole
server process tree (app, vLLM EngineCore, worker) every few seconds, waits
for the server to go idle after the clients left, stops everything, and
writes to --out (default bench/out/soak-<timestamp>):
    samples.csv    one row per memory sample (+ /status counts)
    requests.csv   one row per Locust request event
    summary.json   counts, latency percentiles, memory slopes, state after the clients left
    soak.png       anonymous memory per process and latency over time
                   (drawn again from the files: bench/memory/soak.py --replot <folder>)
    bench/memory/soak.py --slopes <folder> 0-30 60-150 ...   prints every numeric column's slope per hour
                   [Sen 95%] in each window (minutes from the load's start; bytes as MB);
                   add --in-flight-at-most 8 to fit only samples taken with <= 8 turns running
                   (live buffers of running steps swing with the load, retention does not)
    server.log, locust.log, locust_*.csv
The server inherits this shell's environment, so any app setting applies
(e.g. DTYPE=float32 MAX_NUM_BATCHED_TOKENS=2048 .venv/bin/python bench/memory/soak.py ...).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import psutil

from bench.common import machine_info, parse_duration, percentile, process_label
from harness.server import AppServer
from services.observability.memory import proc_status_bytes

MB = 1024 * 1024
TINY_MAX_MODEL_LEN = 4096  # the tiny model's context (as in tests/conftest.py)
STATUS_FIELDS = (
    "sessions",
    "turns_in_flight",
    "engine_unfinished_requests",
    "chainlit_ws_sessions",
    "chainlit_user_sessions",
    "chainlit_chat_contexts",
)
HISTORY_FIELDS = ("database_bytes", "sqlite_memory_bytes")  # from /status["history"], as history_<name>
APP_FIELDS = ("app_python_allocated_blocks", "app_asyncio_tasks", "app_tokenizer_copies")  # from /status
MALLOC_FIELDS = ("in_use_bytes", "free_in_heaps_bytes", "mmapped_bytes")  # /status["app_malloc"], prefixed
# /status["app_pymalloc"] ("pymalloc.<name>"), as app_pymalloc_<name>: Python's arenas, outside malloc
PYMALLOC_FIELDS = ("arenas", "allocated_bytes", "available_bytes", "unused_pool_bytes")
PROCESS_LABELS = ("app", "engine_core", "worker", "other")
SLOPE_MAX_POINTS = 1500  # Theil-Sen on at most this many points (~1.1M pairs): every sample of an hour at 5 s
SLOPE_WINDOWS = 4  # the post-warm-up period is also fitted in this many consecutive windows


@dataclass
class SoakOptions:
    """One soak run. Durations in seconds."""

    duration_s: float = 600.0
    users: int = 50
    spawn_rate: float = 10.0
    vanish_fraction: float = 0.2
    long_fraction: float = 0.2
    max_new_tokens: int = 64
    turns_per_session: int = 3
    turn_timeout_s: float = 300.0
    model: str = ""
    dtype: str = ""  # empty: the app's default
    tiny: bool = False
    max_model_len: int | None = None
    session_ttl_s: float | None = None
    sample_interval_s: float = 5.0
    warmup_s: float | None = None  # default: min(300 s, a third of the duration)
    drain_timeout_s: float = 60.0
    out: Path | None = None
    extra_env: dict[str, str] = field(default_factory=dict)

    @property
    def warmup(self) -> float:
        return self.warmup_s if self.warmup_s is not None else min(300.0, self.duration_s / 3)


# --- numbers ------------------------------------------------------------------------
def latency_summary(seconds: list[float]) -> dict[str, float | int | None]:
    def rounded(value: float | None) -> float | None:
        return None if value is None else round(value, 3)

    return {
        "count": len(seconds),
        "mean": rounded(sum(seconds) / len(seconds)) if seconds else None,
        "p50": rounded(percentile(seconds, 50)),
        "p95": rounded(percentile(seconds, 95)),
        "p99": rounded(percentile(seconds, 99)),
        "max": rounded(max(seconds)) if seconds else None,
    }


def theil_sen(xs: list[float], ys: list[float]) -> tuple[float, list[float]] | None:
    """The Theil-Sen slope (the app's leak alarm's, services.maintenance) and Sen's 95% interval
    (per x unit), from one pass over the pairwise slopes; None with < 3 points."""
    import numpy as np

    from services.observability.series import theil_sen_interval

    if len(xs) < 3:
        return None
    slope, low, high = theil_sen_interval(
        np.asarray(xs, dtype=float), np.asarray(ys, dtype=float), 0.95, SLOPE_MAX_POINTS
    )
    return None if math.isnan(slope) else (slope, [low, high])


def hourly_fit(
    rows: list[dict[str, Any]], column: str, scale: float = 1.0
) -> tuple[float, list[float]] | None:
    """One column's Theil-Sen slope per hour of `t_s` [Sen 95%], times `scale`, over the samples
    that hold it (the summary's slopes and --slopes' windows both fit with it)."""
    rows = [s for s in rows if s[column] != ""]
    return theil_sen([s["t_s"] / 3600 for s in rows], [s[column] * scale for s in rows])


# --- memory sampling ------------------------------------------------------------------
class MemorySampler:
    """Samples the server's process tree (RSS and PSS per process) and /status into a CSV."""

    def __init__(self, server: AppServer, path: Path, interval_s: float) -> None:
        self.server = server
        self.path = path
        self.interval_s = interval_s
        self.phase = "idle"
        self.started = time.monotonic()
        self.rows: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="memory-sampler", daemon=True)
        self._columns = [
            "t_s",
            "unix_time",
            "phase",
            "total_rss_mb",
            "total_pss_mb",
            "total_anon_mb",
            "processes",
        ]
        self._columns += [f"rss_mb_{label}" for label in PROCESS_LABELS]
        self._columns += [f"anon_mb_{label}" for label in PROCESS_LABELS] + ["exec_maps_worker"]
        self._columns += [*STATUS_FIELDS, *(f"history_{name}" for name in HISTORY_FIELDS)]
        self._columns += [*APP_FIELDS, *(f"app_malloc_{name}" for name in MALLOC_FIELDS)]
        self._columns += [f"app_pymalloc_{name}" for name in PYMALLOC_FIELDS]

    def start(self) -> MemorySampler:
        with self.path.open("w", newline="") as file:
            csv.writer(file).writerow(self._columns)
        self.sample()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        self.sample()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def sample(self) -> dict[str, Any]:
        assert self.server.process is not None
        app_pid = self.server.process.pid
        row: dict[str, Any] = {
            "t_s": round(time.monotonic() - self.started, 2),
            "unix_time": round(time.time(), 2),
        }
        row["phase"] = self.phase
        by_label = dict.fromkeys(PROCESS_LABELS, 0.0)
        anon_by_label = dict.fromkeys(PROCESS_LABELS, 0.0)
        exec_maps = 0
        total_rss = total_pss = 0.0
        count = 0
        try:
            root = psutil.Process(app_pid)
            tree = [root, *root.children(recursive=True)]
        except psutil.Error:
            tree = []
        for process in tree:
            try:
                info = process.memory_full_info()
            except psutil.Error:
                continue
            rss = info.rss / MB
            label = process_label(process, app_pid)
            by_label[label] += rss
            anon_by_label[label] += anon_mb(process.pid)
            if label == "worker":
                exec_maps += executable_mappings(process.pid)
            total_rss += rss
            total_pss += getattr(info, "pss", info.rss) / MB
            count += 1
        row.update(total_rss_mb=round(total_rss, 1), total_pss_mb=round(total_pss, 1), processes=count)
        row["total_anon_mb"] = round(sum(anon_by_label.values()), 1)
        row.update({f"rss_mb_{label}": round(value, 1) for label, value in by_label.items()})
        row.update({f"anon_mb_{label}": round(value, 1) for label, value in anon_by_label.items()})
        row["exec_maps_worker"] = exec_maps
        try:
            status = self.server.status()
        except Exception:
            status = {}
        row.update({name: status.get(name, "") for name in STATUS_FIELDS})
        history = status.get("history") or {}
        row.update({f"history_{name}": history.get(name, "") for name in HISTORY_FIELDS})
        row.update({name: status.get(name, "") for name in APP_FIELDS})
        app_malloc = status.get("app_malloc") or {}
        row.update({f"app_malloc_{name}": app_malloc.get(name, "") for name in MALLOC_FIELDS})
        pymalloc = status.get("app_pymalloc") or {}
        row.update({f"app_pymalloc_{n}": pymalloc.get(f"pymalloc.{n}", "") for n in PYMALLOC_FIELDS})
        self.rows.append(row)
        with self.path.open("a", newline="") as file:
            csv.writer(file).writerow([row[column] for column in self._columns])
        return row


def anon_mb(pid: int) -> float:
    """RssAnon of `pid` in MB (heap, arenas, anonymous mmaps), 0 when unreadable."""
    return proc_status_bytes(pid, ("RssAnon",)).get("RssAnon", 0) / MB


def executable_mappings(pid: int) -> int:
    """Executable mappings of `pid`: JIT-compiled kernels (oneDNN primitives) show up here."""
    try:
        with open(f"/proc/{pid}/maps") as file:
            return sum(1 for line in file if line.split(maxsplit=2)[1][2] == "x")
    except (OSError, IndexError):
        return 0


# --- the run --------------------------------------------------------------------------
def prepare_model(options: SoakOptions) -> dict[str, str]:
    """Env vars that pick the model; builds the tiny model when asked."""
    if not options.tiny:
        env = {"MODEL": options.model}
        if options.max_model_len:
            env["MAX_MODEL_LEN"] = str(options.max_model_len)
        return env
    from harness.tiny_model import build_tiny_model
    from services.config import Settings
    from services.engine.backends.local import ensure_default_model

    settings = Settings.from_env({})
    default_dir = ensure_default_model(settings)
    tiny_dir = build_tiny_model(default_dir, Path(settings.cache_dir) / "models" / "tiny-llama")
    max_len = options.max_model_len or TINY_MAX_MODEL_LEN
    return {"MODEL": str(tiny_dir), "MAX_MODEL_LEN": str(max_len), "MAX_NUM_BATCHED_TOKENS": str(max_len)}


def server_env(options: SoakOptions) -> dict[str, str]:
    env = prepare_model(options)
    env["MAX_NEW_TOKENS"] = str(options.max_new_tokens)
    if options.dtype:
        env["DTYPE"] = options.dtype
    if options.session_ttl_s is not None:
        env["SESSION_TTL_SECONDS"] = str(options.session_ttl_s)
    env.setdefault("MAX_SESSIONS", str(max(1000, options.users * 4)))
    return {**env, **options.extra_env}


def locust_command(options: SoakOptions, host: str, out: Path) -> list[str]:
    return [
        str(Path(sys.executable).with_name("locust")),
        "-f",
        str(ROOT / "locustfile.py"),
        "--headless",
        "-u",
        str(options.users),
        "-r",
        str(options.spawn_rate),
        "-t",
        f"{math.ceil(options.duration_s)}s",
        "--host",
        host,
        "--csv",
        str(out / "locust"),
        "--logfile",
        str(out / "locust.log"),
        "--requests-csv",
        str(out / "requests.csv"),
        "--max-new-tokens",
        str(options.max_new_tokens),
        "--vanish-fraction",
        str(options.vanish_fraction),
        "--long-fraction",
        str(options.long_fraction),
        "--turns-per-session",
        str(options.turns_per_session),
        "--turn-timeout",
        str(options.turn_timeout_s),
        "--stop-timeout",
        "0",
    ]


def idle_after_load(status: dict[str, Any]) -> bool:
    """No request, no turn, and no session but those a vanished page may still reconnect to
    (kept until Chainlit's session_timeout, then dropped by maintenance)."""
    return (
        status.get("engine_unfinished_requests") == 0
        and status.get("sessions") == status.get("sessions_awaiting_reconnect", 0)
        and status.get("turns_in_flight") == 0
    )


def run_soak(options: SoakOptions) -> dict[str, Any]:
    """Run one soak and write its report; returns the summary (also in summary.json)."""
    out = options.out or ROOT / "bench" / "out" / f"soak-{datetime.now():%Y%m%d-%H%M%S}"
    out.mkdir(parents=True, exist_ok=True)
    (out / "requests.csv").unlink(missing_ok=True)  # Locust appends: a reused folder kept an old run's rows
    env = server_env(options)
    print(f"[soak] report folder: {out}", flush=True)
    server = AppServer(env, out / "server.log")
    began = time.time()
    machine_before = machine_info()
    locust_exit: int | None = None
    load_seconds: float | None = None
    after: dict[str, Any] = {}
    leftovers: list[Any] = []
    sampler: MemorySampler | None = None
    try:
        server.start(timeout=900)
        print(f"[soak] server ready at {server.base_url}; load for {options.duration_s:g} s", flush=True)
        sampler = MemorySampler(server, out / "samples.csv", options.sample_interval_s).start()
        sampler.phase = "load"
        load_started = time.monotonic()
        with (out / "locust-stdout.txt").open("wb") as log:
            locust = subprocess.Popen(
                locust_command(options, server.base_url, out), cwd=ROOT, stdout=log, stderr=subprocess.STDOUT
            )
            try:
                locust_exit = locust.wait(timeout=options.duration_s + 120)
            except subprocess.TimeoutExpired:
                locust.kill()
                locust_exit = locust.wait()
            finally:
                if locust.poll() is None:
                    locust.kill()
                    locust.wait()
        load_seconds = time.monotonic() - load_started
        sampler.phase = "drain"
        after = drain(server, options)
        print(f"[soak] clients gone; server state: {after}", flush=True)
        sampler.phase = "idle"
    finally:
        if sampler is not None:
            sampler.stop()
        leftovers = server.stop()
    summary = summarize(options, out, sampler.rows if sampler else [], after, began)
    summary["load_seconds"] = None if load_seconds is None else round(load_seconds, 1)
    summary["locust_exit_code"] = locust_exit
    summary["engine_processes_left_after_stop"] = len(leftovers)
    summary["server_env"] = env
    summary["machine_before"] = machine_before
    summary["machine_after"] = machine_info()
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    if sampler is not None:
        plot(out, sampler.rows, options.warmup, summary)
    print(f"[soak] wrote {out / 'summary.json'} and {out / 'soak.png'}", flush=True)
    return summary


def drain(server: AppServer, options: SoakOptions) -> dict[str, Any]:
    """Wait (bounded) until the server holds no session, turn or engine request; return its state."""
    timeout = options.drain_timeout_s
    if options.session_ttl_s is not None:
        timeout = max(timeout, options.session_ttl_s + 30)
    started = time.monotonic()
    status: dict[str, Any] = {}
    while time.monotonic() - started < timeout:
        try:
            status = server.status()
        except Exception:
            status = {}
        if idle_after_load(status):
            break
        time.sleep(0.5)
    idle = idle_after_load(status)
    return {
        **{
            name: status.get(name)
            for name in (
                *STATUS_FIELDS,
                "engine_alive",
                "sessions_dropped_total",
                "sessions_awaiting_reconnect",
            )
        },
        "idle": idle,
        "seconds_to_idle": round(time.monotonic() - started, 1) if idle else None,
    }


# --- report ---------------------------------------------------------------------------
def read_requests(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    with path.open(newline="") as file:
        rows = list(csv.DictReader(file))
    for row in rows:
        row["unix_time"] = float(row["unix_time"])
        row["seconds"] = float(row["response_time_ms"]) / 1000
        row["ok"] = row["ok"] == "1"
    return rows


def summarize(
    options: SoakOptions, out: Path, samples: list[dict[str, Any]], after: dict[str, Any], began: float
) -> dict[str, Any]:
    requests = read_requests(out / "requests.csv")
    by_name: dict[str, dict[str, int]] = {}
    for row in requests:
        counts = by_name.setdefault(row["name"], {"ok": 0, "failed": 0})
        counts["ok" if row["ok"] else "failed"] += 1
    errors = Counter(row["error"] for row in requests if not row["ok"])
    ok = [row for row in requests if row["ok"]]

    def named(prefix: str) -> list[dict[str, Any]]:
        return [row for row in ok if row["name"].startswith(prefix)]

    load = [s for s in samples if s["phase"] == "load" and s["t_s"] >= options.warmup]
    t0 = samples[0]["t_s"] if samples else 0.0

    def per_hour(column: str, rows: list[dict[str, Any]]) -> tuple[float | None, list[float] | None]:
        fit = hourly_fit(rows, column)
        if fit is None:
            return None, None
        return round(fit[0], 2), [round(bound, 2) for bound in fit[1]]

    fits = {column: per_hour(column, load) for column in memory_columns()}
    slope = {column: fit[0] for column, fit in fits.items()}
    interval = {column: fit[1] for column, fit in fits.items()}

    load_began = next((s["t_s"] for s in samples if s["phase"] == "load"), t0)
    windows = []
    for rows in split_evenly(load, SLOPE_WINDOWS):
        span = [round((rows[i]["t_s"] - load_began) / 60, 1) for i in (0, -1)]
        windows.append(
            {
                "minutes": span,
                "rss_mb_per_hour": per_hour("total_rss_mb", rows)[0],
                "anon_mb_per_hour": per_hour("total_anon_mb", rows)[0],
            }
        )

    first, last = (samples[0], samples[-1]) if samples else ({}, {})
    options_dict = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(options).items()}
    return {
        "started_at": datetime.fromtimestamp(began).isoformat(timespec="seconds"),
        "options": options_dict,
        "requests": {
            "ok": len(ok),
            "failed": len(requests) - len(ok),
            "by_name": dict(sorted(by_name.items())),
            "top_errors": dict(errors.most_common(10)),
        },
        "turns_completed": len(named("total")),
        "turns_vanished": len(named("vanish")),
        "turns_refused": len(named("refused")),  # "busy, try again in ~N": the user waited N
        "sessions_opened": len(named("connect")),
        "ttft_s": latency_summary([row["seconds"] for row in named("ttft")]),
        "end_to_end_s": latency_summary([row["seconds"] for row in named("total")]),
        "by_prompt_kind": {
            kind: {
                "ttft_s": latency_summary([r["seconds"] for r in named(f"ttft {kind}")]),
                "end_to_end_s": latency_summary([r["seconds"] for r in named(f"total {kind}")]),
            }
            for kind in ("short", "long")
        },
        "memory": {
            "start_rss_mb": first.get("total_rss_mb"),
            "end_rss_mb": last.get("total_rss_mb"),
            "peak_rss_mb": max((s["total_rss_mb"] for s in samples), default=None),
            "start_pss_mb": first.get("total_pss_mb"),
            "end_pss_mb": last.get("total_pss_mb"),
            "per_process_start_mb": {k: first.get(f"rss_mb_{k}") for k in PROCESS_LABELS},
            "per_process_end_mb": {k: last.get(f"rss_mb_{k}") for k in PROCESS_LABELS},
            "warmup_s": options.warmup,
            "slope_samples": len(load),
            "slope_window_s": round(load[-1]["t_s"] - load[0]["t_s"], 1) if load else 0,
            "rss_mb_per_hour": slope["total_rss_mb"],
            # Sen's interval takes the samples as independent; memory samples are not, so read it as a floor
            "rss_mb_per_hour_95ci": interval["total_rss_mb"],
            "pss_mb_per_hour": slope["total_pss_mb"],
            # Without file-backed pages (library code paged in as new paths run, file caches):
            # those are clean, shared and reclaimable, and bounded by the files' size.
            "anon_mb_per_hour": slope["total_anon_mb"],
            "anon_mb_per_hour_95ci": interval["total_anon_mb"],
            "per_process_rss_mb_per_hour": {k: slope[f"rss_mb_{k}"] for k in PROCESS_LABELS},
            "per_process_anon_mb_per_hour": {k: slope[f"anon_mb_{k}"] for k in PROCESS_LABELS},
            "per_process_rss_mb_per_hour_95ci": {k: interval[f"rss_mb_{k}"] for k in PROCESS_LABELS},
            "per_process_anon_mb_per_hour_95ci": {k: interval[f"anon_mb_{k}"] for k in PROCESS_LABELS},
            "rss_mb_per_hour_by_window": windows,
            "worker_exec_maps_start_end": [first.get("exec_maps_worker"), last.get("exec_maps_worker")],
            "samples": len(samples),
            "first_sample_t_s": t0,
        },
        "after_clients_left": after,
    }


def memory_columns() -> list[str]:
    """The memory columns that get a slope: the tree's RSS, PSS and anon, each process's RSS and anon."""
    per_process = [f"{kind}_mb_{label}" for label in PROCESS_LABELS for kind in ("rss", "anon")]
    return ["total_rss_mb", "total_pss_mb", "total_anon_mb", *per_process]


def split_evenly(rows: list[dict[str, Any]], parts: int) -> list[list[dict[str, Any]]]:
    """`rows` in `parts` consecutive slices of (nearly) equal length; none unless each fits a slope."""
    if len(rows) < 3 * parts:
        return []
    size = len(rows) / parts
    return [rows[round(i * size) : round((i + 1) * size)] for i in range(parts)]


def plot(out: Path, samples: list[dict[str, Any]], warmup_s: float, summary: dict[str, Any]) -> Path:
    """soak.png: memory per process (with the slope fit) over latency per request, on one time axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    load_start = next((s["unix_time"] for s in samples if s["phase"] == "load"), samples[0]["unix_time"])
    minutes = [(s["unix_time"] - load_start) / 60 for s in samples]
    fig, (mem_ax, lat_ax, state_ax) = plt.subplots(
        3, 1, figsize=(8, 7.5), sharex=True, gridspec_kw={"height_ratios": [3, 3, 1.4]}
    )
    # Growth is what matters: each line is anonymous memory (the heaps; RSS also counts file pages
    # that reading a library maps in) minus its value at the first sample.
    for label in PROCESS_LABELS:
        values = [s[f"anon_mb_{label}"] for s in samples]
        if any(values):
            name = f"{label} ({values[0]:.0f} MB at start)"
            mem_ax.plot(minutes, [v - values[0] for v in values], label=name, linewidth=1)
    totals = [s["total_anon_mb"] for s in samples]
    mem_ax.plot(
        minutes,
        [t - totals[0] for t in totals],
        label=f"total ({totals[0]:.0f} MB at start)",
        color="black",
        linewidth=1.4,
    )
    rss = [s["total_rss_mb"] for s in samples]
    mem_ax.plot(minutes, [r - rss[0] for r in rss], ":", color="0.5", linewidth=1, label="total RSS")
    slope = summary["memory"].get("anon_mb_per_hour")
    mem_ax.axvspan(0, warmup_s / 60, color="0.9", label="warm-up (not in slope)")
    fit = [
        (m, s) for m, s in zip(minutes, samples, strict=True) if s["phase"] == "load" and m * 60 >= warmup_s
    ]
    if slope is not None and fit:
        xs = [m for m, _ in fit]
        ys = [s["total_anon_mb"] - totals[0] for _, s in fit]
        mid_x, mid_y = sorted(xs)[len(xs) // 2], sorted(ys)[len(ys) // 2]
        line = [mid_y + slope / 60 * (x - mid_x) for x in xs]
        mem_ax.plot(xs, line, "--", color="crimson", label=f"total, Theil-Sen slope {slope:+.2f} MB/h")
    mem_ax.set_ylabel("anonymous memory change (MB)")
    mem_ax.set_title("Memory of the server process tree and latency under load")
    low, high = mem_ax.get_ylim()
    mem_ax.set_ylim(low, high + 0.35 * (high - low))  # room for the legend above the lines
    mem_ax.legend(fontsize=7, ncol=2, loc="upper left")

    requests = read_requests(out / "requests.csv")
    for prefix, color in (("total", "tab:blue"), ("ttft", "tab:orange")):
        rows = [r for r in requests if r["ok"] and r["name"].startswith(prefix)]
        if rows:
            xs = [(r["unix_time"] - load_start) / 60 for r in rows]
            name = "end-to-end" if prefix == "total" else "time to first token"
            lat_ax.scatter(xs, [r["seconds"] for r in rows], s=3, alpha=0.35, color=color, label=name)
            width = max(minutes[-1] / 25, 1 / 6)
            bins = rolling_p95(xs, [r["seconds"] for r in rows], width)
            if bins:
                lat_ax.plot(*zip(*bins, strict=True), color=color, linewidth=1.3, label=f"{name} P95")
    failed = [(r["unix_time"] - load_start) / 60 for r in requests if not r["ok"]]
    if failed:
        lat_ax.scatter(failed, [0] * len(failed), marker="x", color="red", label="failed")
    lat_ax.set_ylabel("seconds")
    lat_ax.legend(fontsize=7, ncol=2, loc="best")

    for name, style in (("sessions", "-"), ("turns_in_flight", "-"), ("chainlit_ws_sessions", ":")):
        points = [(m, s[name]) for m, s in zip(minutes, samples, strict=True) if s[name] != ""]
        if points:
            state_ax.plot(*zip(*points, strict=True), style, label=name, linewidth=1)
    state_ax.set_ylabel("count")
    state_ax.set_xlabel("minutes since the load started")
    state_ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    path = out / "soak.png"
    fig.savefig(path, dpi=72)
    plt.close(fig)
    return path


def rolling_p95(xs: list[float], ys: list[float], width: float) -> list[tuple[float, float]]:
    """P95 of `ys` per `width`-minute bin of `xs`, at the bin centres."""
    bins: dict[int, list[float]] = {}
    for x, y in zip(xs, ys, strict=True):
        bins.setdefault(math.floor(x / width), []).append(y)
    return [((b + 0.5) * width, percentile(v, 95) or 0.0) for b, v in sorted(bins.items()) if len(v) >= 5]


# --- command line ---------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> SoakOptions:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--duration", type=parse_duration, default=600.0, help="Load time: 90s, 10m, 2h (10m)."
    )
    parser.add_argument("--users", type=int, default=50)
    parser.add_argument("--spawn-rate", type=float, default=10.0, help="Users started per second.")
    parser.add_argument("--vanish-fraction", type=float, default=0.2, help="Users that vanish mid-stream.")
    parser.add_argument("--long-fraction", type=float, default=0.2, help="Messages that are long documents.")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="Answer budget per message.")
    parser.add_argument("--turns-per-session", type=int, default=3)
    parser.add_argument(
        "--turn-timeout", type=float, default=300.0, help="Seconds before a turn counts as failed."
    )
    parser.add_argument("--model", default=os.environ.get("MODEL", ""), help="Model folder (env MODEL).")
    parser.add_argument("--dtype", default="", help="DTYPE of the server (default: the app's).")
    parser.add_argument("--tiny", action="store_true", help="Use the tiny random test model.")
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument("--session-ttl", type=float, default=None, help="SESSION_TTL_SECONDS of the server.")
    parser.add_argument("--sample-interval", type=float, default=5.0, help="Seconds between memory samples.")
    parser.add_argument("--warmup", type=parse_duration, default=None, help="Left out of the slope.")
    parser.add_argument("--drain-timeout", type=float, default=60.0, help="Wait for idle after the load.")
    parser.add_argument("--out", type=Path, default=None, help="Report folder.")
    parser.add_argument(
        "--server-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="A variable for the server only, not Locust (e.g. LD_PRELOAD=...); repeatable.",
    )
    args = parser.parse_args(argv)
    server_only = dict(item.split("=", 1) for item in args.server_env)
    return SoakOptions(
        duration_s=args.duration,
        users=args.users,
        spawn_rate=args.spawn_rate,
        vanish_fraction=args.vanish_fraction,
        long_fraction=args.long_fraction,
        max_new_tokens=args.max_new_tokens,
        turns_per_session=args.turns_per_session,
        turn_timeout_s=args.turn_timeout,
        model=args.model,
        dtype=args.dtype,
        tiny=args.tiny,
        max_model_len=args.max_model_len,
        session_ttl_s=args.session_ttl,
        sample_interval_s=args.sample_interval,
        warmup_s=args.warmup,
        drain_timeout_s=args.drain_timeout,
        out=args.out,
        extra_env=server_only,
    )


def read_samples(out: Path) -> list[dict[str, Any]]:
    """`out`/samples.csv with numbers as floats (empty cells stay "")."""
    with (out / "samples.csv").open(newline="") as file:
        return [
            {k: v if k == "phase" or v == "" else float(v) for k, v in row.items()}
            for row in csv.DictReader(file)
        ]


def replot(out: Path) -> Path:
    """Draw `out`/soak.png again from the run's samples.csv and summary.json."""
    summary = json.loads((out / "summary.json").read_text())
    return plot(out, read_samples(out), summary["memory"]["warmup_s"], summary)


def window_slopes(
    samples: list[dict[str, Any]], windows: list[tuple[float, float]], in_flight_at_most: float | None = None
) -> dict[str, Any]:
    """Each numeric column's Theil-Sen slope per hour [Sen 95%] in each window of the load phase,
    in minutes from its first sample; `*_bytes` columns in MB (1e6 bytes). None: < 3 samples.
    With `in_flight_at_most`, only samples taken while at most that many turns were running."""
    load = [s for s in samples if s["phase"] == "load"]
    began = load[0]["t_s"] if load else 0.0
    columns = [c for c in (load[0] if load else {}) if c not in ("t_s", "unix_time", "phase")]
    if in_flight_at_most is not None:
        load = [
            s
            for s in load
            if s.get("turns_in_flight", "") != "" and s["turns_in_flight"] <= in_flight_at_most
        ]
    in_windows = [[s for s in load if low * 60 <= s["t_s"] - began <= high * 60] for low, high in windows]
    slopes: dict[str, list[str | None]] = {}
    for column in columns:
        scale = 1e-6 if column.endswith("_bytes") else 1.0
        cells: list[str | None] = []
        for rows in in_windows:
            fit = hourly_fit(rows, column, scale)
            cells.append(None if fit is None else f"{fit[0]:.2f} [{fit[1][0]:.2f}, {fit[1][1]:.2f}]")
        slopes[column] = cells
    return {
        "units": "per hour: MB for *_mb and *_bytes columns, a count otherwise; Theil-Sen [Sen 95%]",
        "windows_minutes": [list(window) for window in windows],
        "in_flight_at_most": in_flight_at_most,
        "samples": [len(rows) for rows in in_windows],
        "slopes": slopes,
    }


def slopes_command(args: list[str]) -> dict[str, Any]:
    """bench/memory/soak.py --slopes <folder> 0-30 60-150 [--in-flight-at-most N]"""
    folder = Path(args[0])
    rest = list(args[1:])
    at_most = None
    if "--in-flight-at-most" in rest:
        at = rest.index("--in-flight-at-most")
        at_most = float(rest[at + 1])
        del rest[at : at + 2]
    windows = [tuple(float(m) for m in text.split("-")) for text in rest]
    return {"source": str(folder / "samples.csv"), **window_slopes(read_samples(folder), windows, at_most)}


def main(argv: list[str] | None = None) -> int:
    # SIGTERM (e.g. from timeout(1)) unwinds like Ctrl-C, so the server and Locust are stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--replot"] and len(args) == 2:  # bench/memory/soak.py --replot <report folder>
        print(f"[soak] wrote {replot(Path(args[1]))}")
        return 0
    if args[:1] == ["--slopes"] and len(args) >= 3:  # bench/memory/soak.py --slopes <folder> 0-30 60-150
        print(json.dumps(slopes_command(args[1:]), indent=1))
        return 0
    summary = run_soak(parse_args(args))
    shown = {
        k: summary[k] for k in ("requests", "turns_completed", "turns_vanished", "ttft_s", "end_to_end_s")
    }
    print(
        json.dumps({**shown, "memory": summary["memory"], "after": summary["after_clients_left"]}, indent=2)
    )
    clean = summary["requests"]["failed"] == 0 and summary["after_clients_left"].get("idle")
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
