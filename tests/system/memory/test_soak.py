"""A one-minute soak on the tiny model: Locust over socket.io, then nothing may be left behind."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from bench.memory.soak import SoakOptions, run_soak
from tests.conftest import ARTIFACTS, TINY_MAX_MODEL_LEN

# a one-minute soak: per commit, test_vanishing_pages.py checks the same leftovers
pytestmark = [pytest.mark.long, pytest.mark.timeout(900)]

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
