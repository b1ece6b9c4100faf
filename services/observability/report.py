"""The numbers behind GET /stats and the /stats chat command: percentiles, memory, slope, and a plot.

The plot is drawn by a short-lived child process (plots.py), so matplotlib
never lives in the app; one plot at a time.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
from typing import Any

import numpy as np

from services.engine import sanitize
from services.observability import plots
from services.observability.maintenance import Maintenance
from services.observability.memory import MB, PROCESS_KINDS
from services.observability.metrics import PERCENTILES, ServiceParts

logger = logging.getLogger(__name__)

PLOT_MAX_POINTS = 1000  # points drawn per series: drawing time grows with them
PLOT_TIMEOUT_SECONDS = 60.0
LATENCY_ROWS = (
    ("Queue time", "queue_seconds"),
    ("Time to first token", "ttft_seconds"),
    ("Inter-token latency", "inter_token_seconds"),
    ("End-to-end", "e2e_seconds"),
)


class StatsReport:
    """The /stats JSON and the /stats chat report of one service."""

    def __init__(self, parts: ServiceParts) -> None:
        self._parts = parts
        self._render_lock = asyncio.Lock()  # one plot process at a time

    def summary(self) -> dict[str, Any]:
        """The JSON of GET /stats: latency percentiles, memory now and its slope, counts, uptime."""
        parts = self._parts
        running = parts.running()
        summary: dict[str, Any] = {
            "ready": running is not None,
            "uptime_seconds": round(parts.uptime_seconds, 1),
        }
        if running is None:
            return summary
        summary.update(parts.status())
        summary["requests"] = {"kept": len(running.requests.ring), **running.requests.percentiles()}
        summary["memory"] = _memory_summary(running.maintenance, parts.settings.leak_alarm_mb_per_hour)
        summary.update(_maintenance_summary(running.maintenance))
        return summary

    async def render(self) -> tuple[str, bytes]:
        """Markdown with the key numbers, and a PNG plot of memory per process and latency over time.

        If drawing fails, the PNG is empty and the text says so.
        """
        text = report_text(self.summary())
        data = self._plot_data()
        async with self._render_lock:
            try:
                png = await _run_plot_process(data)
            except (OSError, RuntimeError, TimeoutError) as error:  # the numbers still help without a plot
                logger.warning("stats plot failed: %s", sanitize(str(error)))
                return text + "\n\n_(The plot could not be drawn; see the server log.)_", b""
        return text, png

    def _plot_data(self) -> bytes:
        """A copy of the memory and latency series, thinned, encoded for the plot process."""
        running = self._parts.running()
        memory_plot: dict[str, np.ndarray] = {}
        memory_times = latency_times = ttft = e2e = np.empty(0)
        if running is not None:
            memory = running.maintenance.memory
            keep = _evenly_spaced(len(memory.ring))
            memory_times = memory.ring.times()[keep]
            memory_plot = {role: values[keep] for role, values in memory.process_series("rss").items()}
            memory_plot[plots.WHOLE_TREE] = memory.ring.column("tree_anon_swap")[keep]
        if running is not None:
            ring = running.requests.ring
            keep = _evenly_spaced(len(ring))
            latency_times = ring.times()[keep]
            ttft, e2e = ring.column("ttft_seconds")[keep], ring.column("e2e_seconds")[keep]
        latency = {"time to first token": ttft, "end-to-end": e2e}
        return plots.encode(time.monotonic(), memory_times, memory_plot, latency_times, latency)


def _mb(value: float | None) -> float | None:
    return None if value is None else round(value / MB, 1)


def _memory_summary(maintenance: Maintenance, alarm_mb_per_hour: float) -> dict[str, Any]:
    memory = maintenance.memory
    sample = maintenance.memory.latest
    slope = memory.slope_mb_per_hour
    summary: dict[str, Any] = {
        "samples": len(memory.ring),
        "growth_mb_per_hour": None if slope is None else round(slope, 2),
        "leak_alarm": memory.alarm,
        "leak_alarm_mb_per_hour": alarm_mb_per_hour,
    }
    if sample is not None:
        growth = memory.process_growth()  # per process: mb_per_hour, bytes_per_request
        summary.update(
            {
                "sampled_seconds_ago": round(time.monotonic() - sample.at, 1),
                "processes": [
                    {
                        "role": p.role,
                        "pid": p.pid,
                        **{f"{k}_mb": _mb(getattr(p, k)) for k in PROCESS_KINDS},
                        **_rounded(growth.get(p.role, {})),
                    }
                    for p in sample.processes
                ],
                "tree_mb": {k: _mb(sample.tree(k)) for k in ("rss", "uss", "anon_swap")},
                "gpu_mb": {"allocated": _mb(sample.gpu_allocated), "reserved": _mb(sample.gpu_reserved)},
                "kv_cache_usage": sample.kv_cache_usage,
            }
        )
    return summary


def _rounded(growth: dict[str, float | None]) -> dict[str, float | None]:
    return {
        key: None if value is None else round(value, 2 if "mb" in key else 0) for key, value in growth.items()
    }


def _maintenance_summary(maintenance: Maintenance) -> dict[str, Any]:
    lag = maintenance.loop_lag
    last = maintenance.last_round
    return {
        "event_loop_lag_seconds": {
            "latest": round(lag.latest_seconds, 4),
            "p99_last_minute": round(lag.percentile(99), 4),
            "max_last_minute": round(lag.max_seconds, 4),
        },
        "maintenance": {
            "rounds": maintenance.rounds,
            "expired_sessions_total": maintenance.expired_sessions_total,
            "aborted_requests_total": maintenance.aborted_requests_total,
            "last_round": None
            if last is None
            else {
                "expired_sessions": last.expired_sessions,
                "aborted_requests": last.aborted_requests,
                "gc_collected": last.gc_collected,
                "seconds": round(last.seconds, 4),
            },
        },
    }


async def _run_plot_process(data: bytes) -> bytes:
    """Run plots.py on `data`; kill it on timeout or cancellation."""
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-I",
        plots.__file__,  # -I: the services folder must not shadow modules
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "MPLBACKEND": "Agg"},
    )
    try:
        async with asyncio.timeout(PLOT_TIMEOUT_SECONDS):
            png, errors = await child.communicate(data)
    finally:
        if child.returncode is None:
            child.kill()
            await child.wait()
    if child.returncode != 0 or not png.startswith(b"\x89PNG"):
        raise RuntimeError(
            f"plot process failed ({child.returncode}): {errors.decode(errors='replace')[-500:]}"
        )
    return png


def _evenly_spaced(count: int, limit: int = PLOT_MAX_POINTS) -> np.ndarray:
    """Indices of at most `limit` rows spread over `count`, newest included."""
    return np.unique(np.linspace(0, count - 1, min(count, limit)).round().astype(int))


def _seconds(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


def report_text(summary: dict[str, Any]) -> str:
    """The /stats chat message (Markdown) for a `StatsReport.summary()`."""
    if not summary.get("ready"):
        return "**Service stats**: not ready yet."
    lines = [f"**Service stats** (up {_duration(summary['uptime_seconds'])})", ""]
    if requests := summary.get("requests"):
        lines += [f"Requests kept: {requests['kept']:,}", "", "| | P50 | P95 | P99 |", "|---|---|---|---|"]
        for label, key in LATENCY_ROWS:
            cells = [_seconds(requests[key][f"p{q}"]) for q in PERCENTILES]
            lines.append(f"| {label} | {' | '.join(cells)} |")
        tokens = [requests["output_tokens"][f"p{q}"] for q in PERCENTILES]
        cells = ["–" if value is None else f"{value:.0f}" for value in tokens]
        lines.append(f"| Tokens out | {' | '.join(cells)} |")
    if memory := summary.get("memory"):
        lines += ["", *_memory_lines(memory)]
    lag = summary.get("event_loop_lag_seconds", {})
    lines.append(
        f"Sessions {summary['sessions']} · turns in flight {summary['turns_in_flight']} · engine requests "
        f"{summary['engine_unfinished_requests']} · loop lag max {_seconds(lag.get('max_last_minute'))}."
    )
    return "\n".join(lines)


def _memory_lines(memory: dict[str, Any]) -> list[str]:
    lines = []
    if "processes" in memory:
        per_process = ", ".join(f"{p['role']} {p['rss_mb']:,.0f} MB" for p in memory["processes"])
        tree = memory["tree_mb"]["anon_swap"]
        lines.append(f"Memory (RSS): {per_process}; whole tree anon+swap {tree:,.0f} MB.")
    if any(p.get("mb_per_hour") is not None for p in memory.get("processes", [])):
        lines.append(
            "Growth per process (anon+swap): " + ", ".join(map(_growth_text, memory["processes"])) + "."
        )
    growth = memory["growth_mb_per_hour"]
    alarm = " ⚠️ **leak alarm**" if memory["leak_alarm"] else ""
    lines.append(
        "Growth: still collecting samples after warm-up."
        if growth is None
        else f"Growth: {growth:+.1f} MB/hour (alarm above {memory['leak_alarm_mb_per_hour']:g}){alarm}."
    )
    return lines


def _growth_text(process: dict[str, Any]) -> str:
    per_hour = process.get("mb_per_hour")
    per_request = process.get("bytes_per_request")
    hourly = "–" if per_hour is None else f"{per_hour:+.1f} MB/hour"
    requests = "" if per_request is None else f" ({per_request:+,.0f} B/request)"
    return f"{process['role']} {hourly}{requests}"


def _duration(seconds: float) -> str:
    minutes = int(seconds // 60)
    if minutes >= 60:
        return f"{minutes // 60} h {minutes % 60} min"
    return f"{minutes} min {int(seconds % 60)} s"
