"""The soak's own parts without a model: a browser's reconnect back-off, sample windows and the
Theil-Sen slopes the verdict reads (the one-minute soak itself: tests/system/memory/test_soak.py).
"""

from __future__ import annotations

import random

import pytest

from bench.memory.soak import parse_duration, split_evenly, theil_sen, window_slopes
from harness.chat_client import reconnect_delay_seconds


def test_failed_connects_back_off_as_a_browser_does() -> None:
    rng = random.Random(7)
    assert reconnect_delay_seconds(0, rng) == 0.0
    for failures, base in ((1, 1.0), (2, 2.0), (3, 4.0), (4, 5.0), (50, 5.0)):
        delays = [reconnect_delay_seconds(failures, rng) for _ in range(200)]
        assert base * 0.5 <= min(delays) < base * 0.7 and base * 1.3 < max(delays) <= base * 1.5, failures


def test_windows_split_the_samples_in_order_without_losing_any() -> None:
    rows = [{"t_s": float(i)} for i in range(14)]
    windows = split_evenly(rows, 4)
    assert sorted(len(w) for w in windows) == [3, 3, 4, 4]
    assert [row for w in windows for row in w] == rows
    assert split_evenly(rows[:11], 4) == [], "a slope needs three samples in every window"


def test_slope_ignores_a_one_off_step_and_outliers() -> None:
    hours = [i / 60 for i in range(120)]  # two hours, one sample a minute
    flat = [1000.0 + (50 if i > 90 else 0) + (300 if i % 17 == 0 else 0) for i in range(120)]
    slope, (low, high) = theil_sen(hours, flat)
    assert abs(slope) < 1.0 and low <= slope <= high, "a GC step and spikes are not a trend"
    growing = [1000.0 + 70 * h for h in hours]
    assert theil_sen(hours, growing) == (pytest.approx(70.0), [pytest.approx(70.0), pytest.approx(70.0)])
    assert theil_sen(hours[:2], growing[:2]) is None, "a slope needs three samples"
    assert parse_duration("1h30m") == 5400 and parse_duration("45s") == 45 and parse_duration("600") == 600


def test_window_slopes_fit_each_column_in_each_window_from_the_loads_start() -> None:
    """Growth of 6 MB/hour then none, in MB and in bytes; the warm-up rows before the load are not counted."""
    samples = [
        {"t_s": -60.0 * i, "phase": "start", "anon_mb_app": 999.0, "in_use_bytes": 0.0} for i in (2, 1)
    ]
    for minute in range(61):
        mb = 100 + 0.1 * min(minute, 30)  # 0.1 MB a minute for 30 minutes, then flat
        samples.append(
            {"t_s": 30.0 + 60 * minute, "phase": "load", "anon_mb_app": mb, "in_use_bytes": mb * 1e6}
        )
    report = window_slopes(samples, [(0, 30), (30, 60), (0, 1)])
    rising, flat, too_short = report["slopes"]["anon_mb_app"]
    assert rising == "6.00 [6.00, 6.00]" and flat == "0.00 [0.00, 0.00]" and too_short is None
    assert report["slopes"]["in_use_bytes"][:2] == [rising, flat]


def test_window_slopes_can_leave_out_samples_taken_under_load() -> None:
    """Flat retention under live buffers that follow the load, which is busier in the second half:
    all samples show a slope, the samples with few turns running show none."""
    samples = []
    for minute in range(61):
        running = 2 + (10 * (minute % 6) if minute >= 30 else 0)  # 2 turns, then 2-52
        mb = 100 + 0.2 * running
        samples.append(
            {"t_s": 60.0 * minute, "phase": "load", "anon_mb_worker": mb, "turns_in_flight": running}
        )
    everything = window_slopes(samples, [(0, 60)])["slopes"]["anon_mb_worker"][0]
    quiet = window_slopes(samples, [(0, 60)], in_flight_at_most=8)
    assert not everything.startswith("0.00") and quiet["slopes"]["anon_mb_worker"][0] == "0.00 [0.00, 0.00]"
    assert quiet["samples"] == [30 + 6] and quiet["in_flight_at_most"] == 8
