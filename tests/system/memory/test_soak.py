"""A one-minute soak on the tiny model: Locust over socket.io, then nothing may be left behind."""

from __future__ import annotations

import csv
import json
import random
import shutil
from pathlib import Path
from typing import Any

import pytest

from bench.memory.soak import SoakOptions, parse_duration, run_soak, split_evenly, theil_sen, window_slopes
from harness.chat_client import reconnect_delay_seconds
from tests.conftest import ARTIFACTS, TINY_MAX_MODEL_LEN

pytestmark = pytest.mark.timeout(900)

SOAK_OUT = ARTIFACTS / "soak-ci"
USERS = 10
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def soak(tiny_model_dir: Path) -> dict[str, Any]:
    """Run the soak once for every test in this module; its report lands in artifacts/soak-ci."""
    shutil.rmtree(SOAK_OUT, ignore_errors=True)
    options = SoakOptions(
        duration_s=60, users=USERS, spawn_rate=5, vanish_fraction=0.2, max_new_tokens=48,
        model=str(tiny_model_dir), max_model_len=TINY_MAX_MODEL_LEN, session_ttl_s=20,
        sample_interval_s=2, warmup_s=20, drain_timeout_s=30, out=SOAK_OUT,
        extra_env={"MAX_NUM_BATCHED_TOKENS": str(TINY_MAX_MODEL_LEN)},
    )  # fmt: skip
    return run_soak(options)


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


def test_every_request_succeeds_and_the_load_really_ran(soak: dict[str, Any]) -> None:
    assert soak["requests"]["failed"] == 0, soak["requests"]["top_errors"]
    assert soak["turns_completed"] >= 2 * USERS, "each user finished several turns"
    assert soak["turns_vanished"] >= 1, "some users vanished mid-stream"
    assert soak["ttft_s"]["p50"] is not None and soak["end_to_end_s"]["p99"] is not None


def test_nothing_is_held_after_the_clients_left(soak: dict[str, Any]) -> None:
    after = soak["after_clients_left"]
    assert after["idle"], after
    assert after["engine_unfinished_requests"] == 0
    # Vanished pages' conversations wait for a reconnect (Chainlit's session_timeout), idle.
    assert after["sessions"] == after["sessions_awaiting_reconnect"]
    assert after["turns_in_flight"] == 0
    assert soak["engine_processes_left_after_stop"] == 0


def test_report_files_are_written(soak: dict[str, Any]) -> None:
    summary = json.loads((SOAK_OUT / "summary.json").read_text())
    assert summary["requests"] == soak["requests"]
    with (SOAK_OUT / "samples.csv").open(newline="") as file:
        samples = list(csv.DictReader(file))
    assert len(samples) >= 20, "a memory sample every 2 s for a minute"
    assert all(float(row["total_rss_mb"]) > 0 for row in samples)
    assert {row["phase"] for row in samples} >= {"load", "idle"}
    assert soak["memory"]["rss_mb_per_hour"] is not None and soak["memory"]["anon_mb_per_hour"] is not None
    assert all(float(row["anon_mb_worker"]) > 0 for row in samples), "the worker's heap is attributed"
    assert all(int(row["exec_maps_worker"]) > 0 for row in samples), "its code mappings are counted"
    assert all(int(row["app_malloc_in_use_bytes"]) > 0 for row in samples), "the app's heap, from /status"
    assert all(int(row["app_python_allocated_blocks"]) > 0 for row in samples)
    assert all(int(row["app_pymalloc_arenas"]) > 0 for row in samples), "Python's arenas, from /status"
    assert len(soak["memory"]["rss_mb_per_hour_by_window"]) == 4
    assert (SOAK_OUT / "soak.png").read_bytes().startswith(PNG_MAGIC)
    with (SOAK_OUT / "requests.csv").open(newline="") as file:
        assert sum(1 for _ in csv.DictReader(file)) == soak["requests"]["ok"] + soak["requests"]["failed"]


def test_chainlit_keeps_no_chat_context_of_vanished_sessions(soak: dict[str, Any]) -> None:
    assert soak["after_clients_left"]["chainlit_chat_contexts"] == 0
