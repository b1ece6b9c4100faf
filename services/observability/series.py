"""Fixed-size time series (allocated once, so monitoring never grows) and a robust slope over them."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from statistics import NormalDist

import numpy as np

# Theil-Sen is O(n^2) in points: a window is thinned to this many evenly spaced samples.
LEAK_SLOPE_MAX_POINTS = 160


class SampleRing:
    """A fixed-size ring of float rows, allocated once: its memory never grows.

    Preallocating matters here: a deque of sample objects would itself grow
    for hours until full, and the leak slope would measure the monitor.
    """

    def __init__(self, capacity: int, columns: Sequence[str]) -> None:
        self.capacity = capacity
        self.columns = tuple(columns)
        self._column = {name: i for i, name in enumerate(self.columns)}
        self._times = np.full(capacity, np.nan)
        self._rows = np.full((capacity, len(self.columns)), np.nan)
        self._next = 0
        self._count = 0

    def append(self, at: float, values: Mapping[str, float | None]) -> None:
        """Store one row taken at time `at`; unknown names are an error, missing ones NaN."""
        row = self._rows[self._next]
        row.fill(np.nan)
        for name, value in values.items():
            row[self._column[name]] = np.nan if value is None else value
        self._times[self._next] = at
        self._next = (self._next + 1) % self.capacity
        self._count = min(self._count + 1, self.capacity)

    def __len__(self) -> int:
        return self._count

    @property
    def nbytes(self) -> int:
        return self._times.nbytes + self._rows.nbytes

    def _order(self) -> np.ndarray:
        start = (self._next - self._count) % self.capacity
        return (start + np.arange(self._count)) % self.capacity

    def times(self) -> np.ndarray:
        """Times of the stored rows, oldest first (a copy)."""
        return self._times[self._order()]

    def column(self, name: str) -> np.ndarray:
        """One column, oldest first (a copy)."""
        return self._rows[self._order(), self._column[name]]


def thinned(xs: np.ndarray, ys: np.ndarray, max_points: int) -> tuple[np.ndarray, np.ndarray]:
    """At most `max_points` points: the means of consecutive runs of samples, so every sample
    counts. (Keeping every k-th sample instead made a 2-hour soak's slope depend on which
    samples were kept: 1.17 or 1.90 MB/hour for windows one sample apart.)"""
    if len(xs) <= max_points:
        return xs, ys
    runs = np.array_split(np.arange(len(xs)), max_points)
    return np.array([xs[run].mean() for run in runs]), np.array([ys[run].mean() for run in runs])


def pairwise_slopes(xs: np.ndarray, ys: np.ndarray, max_points: int) -> np.ndarray:
    """The slopes between every two (thinned) points with distinct x: Theil-Sen's raw material."""
    xs, ys = thinned(np.asarray(xs, dtype=float), np.asarray(ys, dtype=float), max_points)
    first, second = np.triu_indices(len(xs), k=1)
    dx = xs[second] - xs[first]
    usable = dx != 0
    return (ys[second] - ys[first])[usable] / dx[usable]


def theil_sen_slope(times: np.ndarray, values: np.ndarray, max_points: int = LEAK_SLOPE_MAX_POINTS) -> float:
    """Median of pairwise slopes (units per time unit): robust to spikes and single outliers."""
    slopes = pairwise_slopes(times, values, max_points)
    return float(np.median(slopes)) if len(slopes) else math.nan


def theil_sen_interval(
    xs: np.ndarray, ys: np.ndarray, confidence: float = 0.95, max_points: int = LEAK_SLOPE_MAX_POINTS
) -> tuple[float, float, float]:
    """(slope, low, high): the Theil-Sen slope and Sen's confidence interval for it.

    The interval is read off the sorted pairwise slopes at the ranks that
    Kendall's tau statistic allows at `confidence` (Sen 1968, as in
    scipy.stats.theilslopes, without the correction for ties). NaNs without
    two distinct x.
    """
    slopes = np.sort(pairwise_slopes(xs, ys, max_points))
    if not len(slopes):
        return math.nan, math.nan, math.nan
    n = min(len(xs), max_points)
    pairs = len(slopes)
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    sigma = math.sqrt(n * (n - 1) * (2 * n + 5) / 18)
    low = max(round((pairs - z * sigma) / 2), 0)
    high = min(round((pairs + z * sigma) / 2) - 1, pairs - 1)
    return float(np.median(slopes)), float(slopes[min(low, pairs - 1)]), float(slopes[max(high, 0)])
