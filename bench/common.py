"""Small helpers shared by the benchmark scripts."""

from __future__ import annotations

import contextlib
import math
import os
import platform
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
PROMPTS_FILE = ROOT / "bench" / "data" / "prompts.json"


def percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile (q in 0..100); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def reap_children(grace_s: float = 10.0) -> list[str]:
    """Wait for our child processes to exit, kill those that do not; return them as 'pid name'.

    When vLLM's EngineCore dies (e.g. a step exceeds its execute timeout), its
    worker is re-parented to init and keeps computing; nothing else stops it.
    """
    _, alive = psutil.wait_procs(psutil.Process().children(recursive=True), timeout=grace_s)
    killed = []
    for child in alive:
        with contextlib.suppress(psutil.Error):
            killed.append(f"{child.pid} {' '.join(child.cmdline()[:3])[:80]}")
            child.kill()
    return killed


def process_label(process: psutil.Process, app_pid: int | None) -> str:
    """The role of a process in the server's tree: app, engine_core, worker or other."""
    if process.pid == app_pid:
        return "app"
    try:
        text = process.name() + " " + " ".join(process.cmdline()[:3])
    except psutil.Error:
        return "other"
    if "EngineCore" in text:
        return "engine_core"
    if "Worker" in text or "worker" in text:
        return "worker"
    return "other"


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
