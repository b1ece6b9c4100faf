"""The warm-up's kept decode speeds: found by key and age, bounded, and never trusted when malformed."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from services.config import Settings
from services.engine.warmup_record import MAX_RECORDS, RECORD_FILE, WarmUpRecords, record_key

SPEEDS = {1: 0.01, 2: 0.011, 4: 0.015}


def test_speeds_kept_by_one_start_are_found_by_the_next_with_their_age(tmp_path: Path) -> None:
    WarmUpRecords(str(tmp_path), 24).save("key", SPEEDS)
    speeds, age = WarmUpRecords(str(tmp_path), 24).find("key")
    assert speeds == SPEEDS
    assert 0 <= age < 60
    assert WarmUpRecords(str(tmp_path), 24).find("another key") is None


def test_records_older_than_the_setting_or_with_reuse_off_are_not_used(tmp_path: Path) -> None:
    records = WarmUpRecords(str(tmp_path), 1)
    records.save("key", SPEEDS)
    stored = json.loads((tmp_path / RECORD_FILE).read_text())
    stored["key"]["at"] = time.time() - 2 * 3600
    (tmp_path / RECORD_FILE).write_text(json.dumps(stored))
    assert records.find("key") is None, "two hours old, one allowed"
    assert WarmUpRecords(str(tmp_path), 3).find("key") is not None
    off = WarmUpRecords(str(tmp_path / "off"), 0)
    off.save("key", SPEEDS)
    assert off.find("key") is None and not (tmp_path / "off").exists(), "0 keeps and reads nothing"


@pytest.mark.parametrize(
    "content",
    [
        "not json",
        "[1, 2]",
        json.dumps({"key": "a string"}),
        json.dumps({"key": {"at": "yesterday", "decode_seconds_per_token": {"1": 0.01}}}),
        json.dumps({"key": {"at": time.time(), "decode_seconds_per_token": {"one": 0.01}}}),
        json.dumps({"key": {"at": time.time(), "decode_seconds_per_token": {"1": -1}}}),
        json.dumps({"key": {"at": time.time(), "decode_seconds_per_token": {"1": "NaN"}}}),
        json.dumps({"key": {"at": time.time(), "decode_seconds_per_token": {}}}),
        json.dumps({"key": {"at": time.time() + 3600, "decode_seconds_per_token": {"1": 0.01}}}),
    ],
)
def test_a_malformed_record_means_measuring_again(tmp_path: Path, content: str) -> None:
    (tmp_path / RECORD_FILE).write_text(content)
    records = WarmUpRecords(str(tmp_path), 24)
    assert records.find("key") is None
    records.save("key", SPEEDS)  # and the next save replaces it
    assert records.find("key") == (SPEEDS, pytest.approx(0, abs=60))


def test_the_file_keeps_the_newest_records_only(tmp_path: Path) -> None:
    records = WarmUpRecords(str(tmp_path), 24)
    for index in range(MAX_RECORDS + 5):
        records.save(f"key-{index}", SPEEDS)
    records.save("key-10", SPEEDS)  # saved again: now the newest
    kept = json.loads((tmp_path / RECORD_FILE).read_text())
    assert len(kept) == MAX_RECORDS
    assert "key-0" not in kept and "key-10" in kept and f"key-{MAX_RECORDS + 4}" in kept
    assert not [path for path in tmp_path.iterdir() if path.name != RECORD_FILE], "no temporary file left"


def test_an_unwritable_cache_costs_only_the_record(tmp_path: Path) -> None:
    blocked = tmp_path / "a file"
    blocked.write_text("")
    WarmUpRecords(str(blocked / "cache"), 24).save("key", SPEEDS)  # logs, does not raise


def test_the_key_changes_with_what_the_speeds_depend_on(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    settings = Settings.from_env({}).replace(model=str(model))
    key = record_key(settings, 4096)
    assert record_key(settings, 4096) == key
    assert record_key(settings.replace(warm_up_reuse_hours=1), 4096) == key, "not a cause of speed"
    assert record_key(settings, 2048) != key
    assert record_key(settings.replace(max_num_seqs=2), 4096) != key
    assert record_key(settings.replace(reading_pace_tokens_per_second=9), 4096) != key
    (model / "config.json").write_text('{"hidden_size": 64}')
    assert record_key(settings, 4096) != key, "the model's files changed"
