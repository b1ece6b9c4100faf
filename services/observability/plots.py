"""The /stats plot, drawn in a short-lived process: `python plots.py < data.npz > plot.png`.

Drawing in the app process would keep matplotlib's memory for good (a step
the leak slope would read as growth) and hold the GIL the event loop needs for
seconds. A child process gives both back when it exits. This module imports
only numpy and matplotlib (Agg), so the child starts quickly.
"""

from __future__ import annotations

import io
import sys

import numpy as np

MB = 1024 * 1024
WHOLE_TREE = "whole tree (anon+swap)"


def encode(
    now: float,
    memory_times: np.ndarray,
    memory: dict[str, np.ndarray],
    latency_times: np.ndarray,
    latency: dict[str, np.ndarray],
) -> bytes:
    """Pack the plot's data as .npz bytes (the child's stdin)."""
    arrays = {"now": np.array(now), "memory_times": memory_times, "latency_times": latency_times}
    arrays.update({f"memory/{label}": values for label, values in memory.items()})
    arrays.update({f"latency/{label}": values for label, values in latency.items()})
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def render_png(data: bytes) -> bytes:
    """Memory per process and request latency over time, as PNG bytes."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    arrays = np.load(io.BytesIO(data))
    now = float(arrays["now"])
    series = {name: arrays[name] for name in arrays.files}
    figure = Figure(figsize=(9, 7), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    memory_axes, latency_axes = figure.subplots(2, 1)
    minutes = (series["memory_times"] - now) / 60
    for name, values in series.items():
        if name.startswith("memory/"):
            label = name.removeprefix("memory/")
            style = "--" if label == WHOLE_TREE else "-"
            memory_axes.plot(minutes, values / MB, style, label=label, linewidth=1.2)
    memory_axes.set(title="Memory per process (RSS)", xlabel="minutes ago", ylabel="MB")
    minutes = (series["latency_times"] - now) / 60
    observed = [np.empty(0)]
    for name, values in series.items():
        if name.startswith("latency/"):
            latency_axes.scatter(minutes, values, s=4, label=name.removeprefix("latency/"), alpha=0.6)
            observed.append(values[~np.isnan(values)])
    latency_axes.set(title="Request latency", xlabel="minutes ago", ylabel="seconds")
    seen = np.concatenate(observed)
    if len(seen) and seen.min() > 0:
        latency_axes.set_yscale("log")
    for axes in (memory_axes, latency_axes):
        if axes.has_data():
            axes.legend(loc="upper left", fontsize="small")
        axes.grid(alpha=0.3)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()


if __name__ == "__main__":
    sys.stdout.buffer.write(render_png(sys.stdin.buffer.read()))
