"""Small helpers shared by the benchmark scripts."""

from __future__ import annotations

import contextlib
import math
import os
import platform
from pathlib import Path
from typing import Any

import psutil

from services.engine.processes import process_role, reap

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
