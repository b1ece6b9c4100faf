"""The overload bench's admission timeline without servers: /status samples taken while the load runs,
written one per line, and the means that say which bound set the running limit."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from bench.load.timeline import AdmissionTimeline, sample_of


def status(
    chat: int, documents: int, limit: int, model: int, cap: int | None, slowdown: float
) -> dict[str, Any]:
    return {
        "admission": {
            "running": {"chat": chat, "document": documents},
            "others_running": 0,
            "waiting": 3,
            "running_limit": limit,
            "capacity_limit": model,
            "stream_pace": {"engine_cap": cap, "slowest_stream_tokens_per_second": 4.0},
            "slowdown_vs_warm_up": slowdown,
        }
    }


def test_a_sample_reads_the_admission_numbers_and_survives_a_status_without_them() -> None:
    assert sample_of(status(2, 1, 3, 6, 3, 2.0)) == {
        "running": 3, "documents": 1, "others_running": 0, "waiting": 3, "limit": 3, "capacity_limit": 6,
        "engine_cap": 3, "slowest_stream": 4.0, "slowdown": 2.0,
    }  # fmt: skip
    assert sample_of({})["limit"] is None and sample_of({})["running"] == 0


def test_samples_are_taken_while_the_load_runs_and_say_when_the_pace_cap_bound(tmp_path: Path) -> None:
    shown = iter(
        [[status(2, 1, 3, 6, 3, 2.0), status(1, 0, 3, 5, 4, 3.0)]]  # two replicas: the lower cap binds
        + [[status(4, 0, 6, 6, None, 1.0), status(2, 0, 6, 6, None, 1.0)]] * 1000  # no cap
    )
    calls = 0

    def statuses() -> list[dict[str, Any]]:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise TimeoutError("an app busy past its timeout")
        return next(shown)

    engine_cpu = 0.0

    def machine() -> dict[tuple[int, float], tuple[str, float]]:
        """The engine uses 1.5 cores between two readings, the app none (times follow the clock)."""
        nonlocal engine_cpu
        engine_cpu += 1.5 * 0.02
        return {(1, 0.0): ("engine", engine_cpu), (2, 0.0): ("apps", 3.0)}

    path = tmp_path / "admission.jsonl"
    with AdmissionTimeline(statuses, path, every=0.02, machine=machine) as timeline:
        while len(timeline.samples) < 4:
            time.sleep(0.01)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(lines) == len(timeline.samples) >= 4 and calls > len(lines), "the failed sample is skipped"
    assert [app["running"] for app in lines[0]["apps"]] == [3, 1]
    assert lines[0]["cores"]["apps"] == 0.0 and 0 < lines[0]["cores"]["engine"] <= 1.5
    summary = timeline.summary()
    count = summary["samples"]
    assert summary["pace_cap_binding_share"] == round(1 / count, 2)
    assert summary["app_running_mean"] == round((4 + 6 * (count - 1)) / count, 2)
    assert summary["documents_running_mean"] == round(1 / count, 2)
    assert summary["capacity_limit_mean"] == round((5 + 6 * (count - 1)) / count, 2)
    first_minute = summary["first_minute_cores_by_part"]
    assert set(first_minute) == {"apps", "engine"} and first_minute["apps"] == 0.0
    engine = sum(x["cores"]["engine"] for x in lines) / len(lines)
    assert first_minute["engine"] == pytest.approx(engine, abs=0.01), "every sample is in its first minute"


def test_a_load_too_short_for_a_sample_summarizes_to_none(tmp_path: Path) -> None:
    with AdmissionTimeline(
        lambda: [status(1, 0, 1, 1, None, 1.0)], tmp_path / "a.jsonl", every=60, machine=dict
    ) as timeline:
        pass
    assert timeline.summary() == {"samples": 0} and (tmp_path / "a.jsonl").read_text() == ""
