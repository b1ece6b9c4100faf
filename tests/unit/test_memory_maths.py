"""The arithmetic of the memory tools: Theil-Sen slopes with an interval, thinning, growth per
process per hour and per request (the leak alarm's numbers), and how /stats shows them."""

from __future__ import annotations

import numpy as np
import pytest

from services.config import Settings
from services.observability.memory import MB, MemoryMonitor, MemorySample, ProcessMemory
from services.observability.report import report_text
from services.observability.series import theil_sen_interval, thinned


# --- Theil-Sen with an interval ------------------------------------------------------
def test_theil_sen_interval_holds_the_true_slope_and_narrows_with_more_points() -> None:
    rng = np.random.default_rng(7)
    widths = []
    for points in (10, 40):
        xs = np.arange(points) * 1000.0
        ys = 50.0 * xs + rng.normal(0, 200_000, points)  # 50 B/request under ±0.2 MB of noise
        slope, low, high = theil_sen_interval(xs, ys)
        assert low <= 50.0 <= high
        assert low <= slope <= high
        widths.append(high - low)
    assert widths[1] < widths[0] / 2


def test_theil_sen_interval_of_a_flat_series_is_zero_and_tight() -> None:
    xs = np.arange(20) * 1000.0
    assert theil_sen_interval(xs, np.full(20, 5e8)) == (0.0, 0.0, 0.0)


def test_thinning_averages_every_sample_and_keeps_a_straight_line_straight() -> None:
    xs = np.arange(1000.0)
    thin_xs, thin_ys = thinned(xs, 3.0 * xs + 7.0, 100)
    assert len(thin_xs) == 100 and thin_xs[0] == pytest.approx(4.5)  # the mean of the first run
    assert np.allclose(thin_ys, 3.0 * thin_xs + 7.0)  # every run's mean lies on the line
    assert thin_xs.mean() == xs.mean()  # no sample left out
    assert theil_sen_interval(xs, 3.0 * xs, 0.95, 100) == pytest.approx((3.0, 3.0, 3.0))
    short = np.arange(5.0)
    assert all(a is b for a, b in zip(thinned(short, short, 100), (short, short), strict=True))


# --- bytes per request in the leak alarm -----------------------------------------------
def sample(at: float, requests: int, app_mb: float, worker_mb: float) -> MemorySample:
    def process(pid: int, role: str, mb: float) -> ProcessMemory:
        return ProcessMemory(pid, role, rss=int(mb * MB), vms=0, uss=None, anon=int(mb * MB), swap=0)

    return MemorySample(
        at, (process(1, "app", app_mb), process(2, "Worker", worker_mb)), requests_total=requests
    )


def test_growth_per_process_in_mb_per_hour_and_bytes_per_request() -> None:
    monitor = MemoryMonitor(
        Settings.from_env({}), clock=lambda: 0.0, warmup_seconds=0.0, window_seconds=3600.0
    )
    for minute in range(61):  # 10 requests a second; the worker keeps 3,500 B of each
        requests = minute * 600
        monitor.record(sample(minute * 60.0, requests, 700.0, 2000.0 + requests * 3500 / MB))
    growth = monitor.process_growth(now=3600.0)
    assert growth["app"] == {"mb_per_hour": 0.0, "bytes_per_request": 0.0}
    assert growth["Worker"]["bytes_per_request"] == pytest.approx(3500, rel=0.01)
    assert growth["Worker"]["mb_per_hour"] == pytest.approx(36_000 * 3500 / MB, rel=0.01)


def test_bytes_per_request_waits_for_enough_requests() -> None:
    monitor = MemoryMonitor(
        Settings.from_env({}), clock=lambda: 0.0, warmup_seconds=0.0, window_seconds=3600.0
    )
    for minute in range(61):  # idle: 60 requests in an hour
        monitor.record(sample(minute * 60.0, minute, 700.0, 2000.0 + minute * 0.1))
    growth = monitor.process_growth(now=3600.0)
    assert growth["Worker"]["mb_per_hour"] == pytest.approx(6.0)
    assert growth["Worker"]["bytes_per_request"] is None


def test_stats_text_shows_each_process_growth_per_hour_and_per_request() -> None:
    processes = [
        {"role": "app", "rss_mb": 700.0, "mb_per_hour": 0.4, "bytes_per_request": 3.0},
        {"role": "Worker", "rss_mb": 2000.0, "mb_per_hour": 4.8, "bytes_per_request": 3500.0},
        {"role": "EngineCore", "rss_mb": 600.0, "mb_per_hour": None, "bytes_per_request": None},
    ]
    memory = {"processes": processes, "tree_mb": {"anon_swap": 3000.0}, "growth_mb_per_hour": 5.2,
              "leak_alarm": False, "leak_alarm_mb_per_hour": 10.0}  # fmt: skip
    summary = {"ready": True, "uptime_seconds": 7200, "memory": memory, "sessions": 0,
               "turns_in_flight": 0, "engine_unfinished_requests": 0}  # fmt: skip
    text = report_text(summary)
    assert "app +0.4 MB/hour (+3 B/request), Worker +4.8 MB/hour (+3,500 B/request), EngineCore –" in text
