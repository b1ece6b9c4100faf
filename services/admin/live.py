"""The admin page's live figures: what /status says, and small SVG plots drawn here from the series
the maintenance task already keeps (services/observability/memory.py: memory per process, sessions,
turns in flight, engine requests). SVG made on the server: no script, no image request, no CDN."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from services.admin.html import Html, join, table, tag
from services.admin.sections import Section, Visit

MB = 1024 * 1024
PLOT_POINTS = 120  # points per line at most: runs of samples are averaged
WIDTH = 640
HEIGHT = 160
PAD = 36
MAX_LINES = 8


def _thin(times: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    known = ~np.isnan(values) & ~np.isnan(times)
    times, values = times[known], values[known]
    if len(times) <= PLOT_POINTS:
        return times, values
    runs = np.array_split(np.arange(len(times)), PLOT_POINTS)
    return np.array([times[r].mean() for r in runs]), np.array([values[r].mean() for r in runs])


def svg_plot(title: str, times: np.ndarray, lines: Mapping[str, np.ndarray], unit: str) -> Html:
    """A line per series against minutes ago, with its title, axis range and a legend (classes for colour)."""
    thinned = {label: _thin(times, values) for label, values in list(lines.items())[:MAX_LINES]}
    points = [v for _, v in thinned.values() if len(v)]
    if not points or not len(times):
        return tag("p", f"{title}: no samples yet.", class_="empty")
    low, high = 0.0, max(float(np.max(np.concatenate(points))), 1e-9)
    start, end = float(np.nanmin(times)), float(np.nanmax(times))
    span = max(end - start, 1e-9)
    paths = []
    for index, (label, (xs, ys)) in enumerate(thinned.items()):
        across = PAD + (xs - start) / span * (WIDTH - 2 * PAD)
        up = HEIGHT - PAD - (ys - low) / (high - low) * (HEIGHT - 2 * PAD)
        coords = " ".join(f"{x:.1f},{y:.1f}" for x, y in zip(across, up, strict=True))
        name = f"<title>{_escape(label)}</title>"
        paths.append(f'<polyline class="line line-{index}" points="{coords}">{name}</polyline>')
    axes = (
        f'<line class="axis" x1="{PAD}" y1="{HEIGHT - PAD}" x2="{WIDTH - PAD}" y2="{HEIGHT - PAD}"/>'
        f'<text x="4" y="{PAD - 6}">{_number(high)} {_escape(unit)}</text>'
        f'<text x="4" y="{HEIGHT - PAD + 4}">0</text>'
        f'<text x="{PAD}" y="{HEIGHT - 8}">{_ago(end - start)}</text>'
        f'<text x="{WIDTH - PAD - 20}" y="{HEIGHT - 8}">now</text>'
    )
    svg = Html(
        f'<svg class="plot" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{_escape(title)}">'
        f"{axes}{''.join(paths)}</svg>"
    )
    legend = join(tag("li", label, class_=f"key key-{i}") for i, label in enumerate(thinned))
    return tag("figure", join([tag("figcaption", title), svg, tag("ul", legend, class_="legend")]))


def _escape(value: str) -> str:
    from html import escape

    return escape(value)


def _number(value: float) -> str:
    return f"{value:.0f}" if value >= 10 or value == int(value) else f"{value:.2f}"


def _ago(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h ago" if seconds >= 5400 else f"{math.ceil(seconds / 60)} min ago"


def _figures(status: Mapping[str, Any]) -> list[tuple[str, Any]]:
    admission = status.get("admission") or {}
    refusals = ", ".join(f"{k}: {v}" for k, v in (admission.get("refusals_total") or {}).items()) or "none"
    growth = status.get("memory_growth_mb_per_hour")
    history = status.get("history") or {}
    running = f"{sum((admission.get('running') or {}).values())} ({admission.get('running_limit')})"
    saved = "yes" if history.get("available") else f"no ({history.get('reason') or 'off'})"
    return [
        ("Up for", f"{status.get('uptime_seconds', 0) / 3600:.1f} h"),
        ("Chat sessions", status.get("sessions")),
        ("Turns in flight", status.get("turns_in_flight")),
        ("Engine requests unfinished", status.get("engine_unfinished_requests")),
        ("Waiting in line", admission.get("waiting")),
        ("Running (limit)", running),
        ("Refusals since start", refusals),
        ("Memory growth", "measuring" if growth is None else f"{growth:+.1f} MB/hour"),
        ("Leak alarm", "ON" if status.get("memory_leak_alarm") else "off"),
        ("Conversations saved", saved),
    ]


async def live_page(visit: Visit) -> Html:
    runtime = visit.runtime
    serving = runtime.running()
    if serving is None:
        return tag("p", "The service is starting (or stopping): the engine is not serving yet.")
    status = runtime.status.status()
    memory = serving.maintenance.memory
    times = memory.ring.times()
    now = float(times[-1]) if len(times) else 0.0
    per_process = {role: values / MB for role, values in memory.process_series("rss").items()}
    counts = {
        name.replace("_", " "): memory.ring.column(name)
        for name in ("sessions", "turns_in_flight", "engine_unfinished_requests")
    }
    latest = memory.latest
    rows = [[p.role, p.pid, f"{p.rss / MB:.0f}"] for p in (latest.processes if latest else ())]
    return join(
        [
            table(["Figure", "Now"], _figures(status)),
            tag("h2", "Memory per process"),
            table(["Process", "pid", "RSS (MB)"], rows, "No sample yet."),
            svg_plot("Memory per process (RSS)", times - now, per_process, "MB"),
            svg_plot("Sessions and requests", times - now, counts, ""),
            tag("p", "The same numbers as JSON: GET /status and /stats (OPS_TOKEN).", class_="hint"),
        ]
    )


LIVE = Section("live", "Live figures", live_page)
