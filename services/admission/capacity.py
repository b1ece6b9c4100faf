"""The running limit: how many requests the engine serves at once while every stream keeps a reading pace.

A decode step costs about a + b*n seconds for n running requests (a fixed
overhead plus a share per sequence), and each running request gets one token
per step, so every stream keeps a pace p while a + b*n <= 1/p. `DecodeCapacity`
learns the seconds per token at each batch size from the engine's own windows
(`EngineLoad`, services/engine), fits the line, and derives the limit. Windows where
the engine mostly read prompts (more prompt tokens than generated ones) are left
out: a document part's prefill makes steps seconds long on a CPU, and learning
from them would bring the limit down to 1 for everyone. vLLM counts a prompt's tokens in the step
that ends its prefill, so the steps before, stretched by a long prompt's chunks, count none: the
windows that end while a document part reads its prompt are skipped (Admission.refresh). Learned,
they read as decode four times the warm-up's at one or two streams and held the limit at 1-2 for
minutes while the streams got 6-11 tokens/s.

With the warm-up's batches (a quiet engine, every size measured the same way) the
line is theirs, and live windows only scale it: by the median, over recent decode
windows, of measured over expected seconds per token, kept within
[MIN_SLOWDOWN, MAX_SLOWDOWN]. Live windows are noisy (a prefill chunk, the app's
own work on the same cores), and fitting a line through them once learned 2 s per
token at one stream and 0.2 s at four, which held the limit at 1 for ten minutes.
"""

from __future__ import annotations

import math
import statistics
from collections import deque

import numpy as np

from services.engine import EngineLoad, LoadWindow

# Busy seconds a batch-size bucket remembers: newer windows outweigh older ones beyond it.
BUCKET_MEMORY_SECONDS = 30.0
# Windows mostly idle say little about step time.
MIN_BUSY_SHARE = 0.5
# Recent decode windows behind the slowdown factor (about half a minute of busy engine time).
SLOWDOWN_WINDOWS = 30
MIN_SLOWDOWN_WINDOWS = 5
MIN_SLOWDOWN, MAX_SLOWDOWN = 0.5, 4.0


class DecodeCapacity:
    """Seconds per token per stream, by batch size, and the limit it implies for a reading pace."""

    def __init__(self, pace_tokens_per_second: float, max_running: int) -> None:
        self.pace = pace_tokens_per_second
        self.max_running = max_running
        self._mean = np.zeros(max_running + 1)  # seconds per token, per batch size
        self._weight = np.zeros(max_running + 1)  # busy seconds behind each mean (capped)
        self._seen_until = -math.inf
        self._baseline: tuple[float, float] | None = None  # (a, b) from the warm-up
        self._ratios: deque[float] = deque(maxlen=SLOWDOWN_WINDOWS)  # measured / expected, recent windows

    def set_baseline(self, seconds_per_token_by_batch: dict[int, float]) -> None:
        """The warm-up's step times, as the line live windows scale (two sizes or more)."""
        sizes = sorted(n for n in seconds_per_token_by_batch if n >= 1)
        if len(sizes) < 2:
            return
        values = [seconds_per_token_by_batch[n] for n in sizes]
        slope, intercept = np.polyfit(np.array(sizes, dtype=float), np.array(values), 1)
        self._baseline = float(intercept), max(float(slope), 1e-6)

    def expected(self, size: int) -> float | None:
        """The warm-up line's seconds per token at `size` streams (None without a warm-up)."""
        if self._baseline is None:
            return None
        intercept, slope = self._baseline
        return max(intercept + slope * size, 1e-6)

    @property
    def slowdown(self) -> float:
        """Live steps over the warm-up's: the median of recent decode windows, bounded; 1 until known."""
        if len(self._ratios) < MIN_SLOWDOWN_WINDOWS:
            return 1.0
        return min(MAX_SLOWDOWN, max(MIN_SLOWDOWN, statistics.median(self._ratios)))

    def update(self, load: EngineLoad) -> None:
        """Take in the engine's windows that ended since the last update."""
        for window in load.windows_after(self._seen_until):
            self.observe(window)
            self._seen_until = window.ended_at

    def skip_until(self, moment: float) -> None:
        """Ignore windows that ended before `moment` (already measured another way)."""
        self._seen_until = max(self._seen_until, moment)

    def observe(self, window: LoadWindow) -> None:
        seconds_per_token = window.seconds_per_token
        if seconds_per_token is None or window.busy_seconds < MIN_BUSY_SHARE * window.seconds:
            return
        if window.prompt_tokens > window.generation_tokens:  # mostly prefill: not a decode pace
            return
        size = min(self.max_running, max(1, round(window.running)))
        self.observe_batch(size, seconds_per_token, window.busy_seconds)
        expected = self.expected(size)
        if expected is not None:
            self._ratios.append(seconds_per_token / expected)

    def observe_batch(self, size: int, seconds_per_token: float, busy_seconds: float) -> None:
        """Fold one measurement of `size` streams into its bucket."""
        kept = min(self._weight[size], BUCKET_MEMORY_SECONDS)
        total = kept + busy_seconds
        self._mean[size] = (self._mean[size] * kept + seconds_per_token * busy_seconds) / total
        self._weight[size] = total

    def seconds_per_token(self) -> dict[int, float]:
        """The learned points (batch size: seconds per token per stream), for /status."""
        return {int(n): round(float(self._mean[n]), 4) for n in np.nonzero(self._weight)[0]}

    def line(self) -> tuple[float, float] | None:
        """(a, b) of seconds per token = a + b*n, fitted over the buckets; None below two sizes."""
        sizes = np.nonzero(self._weight)[0]
        if len(sizes) < 2:
            return None
        weights = np.sqrt(np.minimum(self._weight[sizes], BUCKET_MEMORY_SECONDS))
        slope, intercept = np.polyfit(sizes.astype(float), self._mean[sizes], 1, w=weights)
        return float(intercept), float(slope)

    @property
    def limit(self) -> int:
        """Requests to run at once: the most for which every stream still keeps the pace."""
        if self.pace <= 0:
            return self.max_running
        target = 1.0 / self.pace
        if self._baseline is not None:
            intercept, slope = self._baseline
            estimate = math.floor((target / self.slowdown - intercept) / slope + 1e-9)
            return max(1, min(self.max_running, estimate))
        sizes = np.nonzero(self._weight)[0]
        if len(sizes) == 0:
            return 1  # nothing measured yet: one at a time until the engine shows more
        fit = self.line()
        if fit is not None and fit[1] > 0:
            intercept, slope = fit
            estimate = math.floor((target - intercept) / slope)
            ceiling = 2 * int(sizes.max()) + 1  # do not extrapolate far beyond what was seen
            return max(1, min(self.max_running, estimate, ceiling))
        # One size seen, or steps that did not slow with more streams: one past the largest good size,
        # unless that one was seen too slow.
        good = max((int(n) for n in sizes if self._mean[n] <= target), default=0)
        next_seen_slow = good + 1 in sizes and self._mean[good + 1] > target
        return max(1, min(self.max_running, good if next_seen_slow else good + 1))
