"""Helpers every benchmark shares: paths, percentiles, machine info, clean shutdown, durations, results.

The benchmarks are scripts (`.venv/bin/python bench/<topic>/<name>.py`): each puts
the repository on sys.path before importing this module.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import platform
import re
import signal
from collections.abc import Coroutine
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import psutil

from services.engine.backends.local import process_role, reap

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "bench" / "data"
PROMPTS_FILE = DATA / "prompts.json"
OUT = ROOT / "bench" / "out"  # reports of every run (git-ignored)
RESULTS = ROOT / "bench" / "results"  # the verdict runs BENCHMARKS.md cites, by topic

T = TypeVar("T")


def result_path(topic: str, stem: str, suffix: str = ".json", at: datetime | None = None) -> Path:
    """Where a run saves a result BENCHMARKS.md may cite: bench/results/<topic>/<stem>-<date-time><suffix>."""
    folder = RESULTS / topic
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{stem}-{(at or datetime.now()):%Y%m%d-%H%M}{suffix}"


def percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile (q in 0..100); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def parse_duration(text: str) -> float:
    """Seconds from '90', '90s', '10m', '2h' or '1h30m'."""
    text = text.strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return float(text)
    parts = re.findall(r"(\d+(?:\.\d+)?)([hms])", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (use e.g. 90s, 10m, 2h, 1h30m)")
    return sum(float(n) * {"h": 3600, "m": 60, "s": 1}[u] for n, u in parts)


def run_until_signalled(main: Coroutine[Any, Any, T]) -> T:
    """asyncio.run(main), but SIGTERM/SIGINT cancel it, so `async with engine_lifespan` exits cleanly.

    Without this, SIGTERM (e.g. from `timeout`) kills the script at once and
    vLLM's worker process lives on, re-parented to init, burning a core.
    """

    async def guarded() -> T:
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, task.cancel)
        return await main

    return asyncio.run(guarded())


def reap_children(grace_s: float = 10.0) -> list[str]:
    """Stop what is left under this process (a dead EngineCore leaves its worker running); return them."""
    left = reap(psutil.Process().children(recursive=True), grace_s)
    return [f"{process.pid} {process_role(process)}" for process in left]


def process_label(process: psutil.Process, app_pid: int | None) -> str:
    """The role of a process in the server's tree: app, engine_core, worker or other."""
    if process.pid == app_pid:
        return "app"
    role = process_role(process)
    if role.startswith("EngineCore"):
        return "engine_core"
    return "worker" if role.startswith("Worker") else "other"


# A machine's processes by part of a deployment: the first rule whose words are in its command wins.
CPU_PARTS = (
    ("engine", ("VLLM::", "vllm.entrypoints", "vllm serve")),  # workers, engine cores, API servers
    ("apps", ("chainlit",)),
    ("router", ("vllm-router", "vllm_router", "vllm::router")),  # it renames its process vllm::router
    ("balancer", ("haproxy",)),
    ("database", ("postgres",)),
    ("load", ("locust",)),
)


def cpu_seconds_by_part() -> dict[tuple[int, float], tuple[str, float]]:
    """CPU seconds so far of every process of the machine, keyed by (pid, start time), with its part
    (CPU_PARTS; "other" for the rest). Two readings' difference is what each part used between them."""
    seen: dict[tuple[int, float], tuple[str, float]] = {}
    for process in psutil.process_iter(["cmdline", "name", "create_time", "cpu_times"]):
        info = process.info
        if info["cpu_times"] is None:
            continue
        command = " ".join(info["cmdline"] or [info["name"] or ""])
        part = next((name for name, words in CPU_PARTS if any(w in command for w in words)), "other")
        seen[(process.pid, info["create_time"])] = (part, info["cpu_times"].user + info["cpu_times"].system)
    return seen


def cores_by_part(
    before: dict[tuple[int, float], tuple[str, float]],
    after: dict[tuple[int, float], tuple[str, float]],
    seconds: float,
) -> dict[str, float]:
    """Cores each part used on average between two readings (processes born between them count whole)."""
    used: dict[str, float] = {}
    for key, (part, cpu) in after.items():
        used[part] = used.get(part, 0.0) + cpu - before.get(key, (part, 0.0))[1]
    return {part: round(total / seconds, 2) for part, total in sorted(used.items())}


def machine_info() -> dict[str, Any]:
    """What the numbers depend on: CPU, its bf16 support, and how busy the machine was."""
    flags: set[str] = set()
    model = platform.processor()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
            elif line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "avx512f": "avx512f" in flags,
        "avx512_bf16": "avx512_bf16" in flags,
        "amx_bf16": "amx_bf16" in flags,
        "load_average_1m": round(os.getloadavg()[0], 2),
    }
