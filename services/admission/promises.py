"""What chat turns were promised when they took a place in line, and what they got.

A chat turn that must wait is accepted on an estimate of its wait (waiting_line.py); what counts
for the person is the first token. Each accepted turn's promise and its actual wait to the first
token are kept for PROMISE_WINDOW_SECONDS. Their gap (actual minus promised, the
LATE_QUANTILE-th of the recent turns) is how late the line runs now, and it is added to every
new estimate: once accepted turns wait longer than they were told (the app itself busy, prompts
longer than usual, streams slower than the warm-up's), new turns are refused instead of joining a
wait that would break the promise, and the correction fades when the late turns age out.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

import numpy as np

PROMISE_WINDOW_SECONDS = 60.0  # how long a kept turn counts
MAX_KEPT = 512  # kept turns at most (a burst keeps the newest)
MIN_TURNS = 3  # fewer recent turns say nothing
LATE_QUANTILE = 90


class WaitPromises:
    """Recent chat turns' promised and actual waits; `late_seconds` corrects new estimates."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._kept: deque[tuple[float, float, float]] = deque(maxlen=MAX_KEPT)  # at, promised, actual

    def keep(self, promised: float, actual: float) -> None:
        """A turn promised `promised` seconds of wait got its first token after `actual` seconds."""
        self._kept.append((self.clock(), promised, actual))

    def _recent(self) -> list[tuple[float, float, float]]:
        horizon = self.clock() - PROMISE_WINDOW_SECONDS
        while self._kept and self._kept[0][0] < horizon:
            self._kept.popleft()
        return list(self._kept)

    @property
    def late_seconds(self) -> float:
        """How much later than promised recent turns got their first token (0 when on time)."""
        recent = self._recent()
        if len(recent) < MIN_TURNS:
            return 0.0
        gaps = np.array([actual - promised for _, promised, actual in recent])
        return max(0.0, float(np.percentile(gaps, LATE_QUANTILE)))

    def status(self) -> dict[str, float | int | None]:
        """Recent promised and actual waits by percentile, and the correction (/status, /metrics)."""
        recent = self._recent()
        if not recent:
            return {"turns": 0, "late_seconds": 0.0}
        promised = np.array([p for _, p, _ in recent])
        actual = np.array([a for _, _, a in recent])
        report: dict[str, float | int | None] = {
            "turns": len(recent),
            "late_seconds": round(self.late_seconds, 2),
        }
        for q in (50, 95, 99):
            report[f"promised_p{q}"] = round(float(np.percentile(promised, q)), 2)
            report[f"actual_p{q}"] = round(float(np.percentile(actual, q)), 2)
        return report
