"""Decode speeds a warm-up measured, kept in CACHE_DIR so that a restart need not measure again.

A record is keyed by everything the speeds depend on: the model's files, the engine
options, the reading pace, vLLM's and torch's versions, the CPU and the cores this
process may use, and vLLM's CPU environment. A restart with the same key, within
WARM_UP_REUSE_HOURS, takes the speeds; its warm-up still runs every batch size once
(with short answers), so the kernels are prepared as before. Admission corrects the
speeds from live decode steps either way (admission/capacity.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import platform
import time
from pathlib import Path
from typing import Any

from services.config import EngineSettings, Settings
from services.config import engine as engine_config
from services.engine import warmup
from services.engine.backends.local import engine as local_engine
from services.engine.backends.remote import routing
from services.memory import allocators, word_caches

logger = logging.getLogger(__name__)

RECORD_FILE = "warm-up.json"
MAX_RECORDS = 32  # one per configuration this cache has seen; the oldest go first
ENV_PREFIXES = ("VLLM_CPU_", "OMP_", "KMP_", "MALLOC_", "LD_PRELOAD", "ONEDNN_", "DNNL_")
SETTINGS_OUTSIDE_ENGINE = ("reading_pace_tokens_per_second", "temperature", "top_p")


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    return platform.processor()


def _model_files(model_path: str) -> list[tuple[str, int, int]]:
    """Name, size and modification time of each file of a model folder (an id: none)."""
    folder = Path(model_path)
    if not folder.is_dir():
        return []
    return sorted(
        (path.name, stat.st_size, stat.st_mtime_ns)
        for path in folder.iterdir()
        if path.is_file() and (stat := path.stat())
    )


def engine_constants() -> dict[str, Any]:
    """The engine's constants, in the key beside its settings under the same kind of names (read at
    each start: a benchmark's arm may change one)."""
    return {
        "engine_mmap_threshold_bytes": allocators.ENGINE_MMAP_THRESHOLD_BYTES,
        "engine_onednn_cache_capacity": local_engine.ENGINE_ONEDNN_CACHE_CAPACITY,
        "engine_onednn_mm_cache": local_engine.ENGINE_ONEDNN_MM_CACHE,
        "tokenizer_word_cache": word_caches.TOKENIZER_WORD_CACHE,
        "engine_affinity_slack": routing.ENGINE_AFFINITY_SLACK,
        "engine_models_max": engine_config.ENGINE_MODELS_MAX,
    }


def record_key(settings: Settings, max_model_len: int) -> str:
    """What the decode speeds depend on, hashed."""
    import torch
    import vllm

    names = [f.name for f in dataclasses.fields(EngineSettings) if f.name != "warm_up_reuse_hours"]
    engine = {name: getattr(settings, name) for name in names} | engine_constants()
    parts: dict[str, Any] = {
        "engine": engine,
        "pace": {name: getattr(settings, name) for name in SETTINGS_OUTSIDE_ENGINE}
        | {"reading_pace_headroom": warmup.READING_PACE_HEADROOM},
        "max_model_len": max_model_len,
        "model_files": _model_files(settings.model_path),
        "versions": [vllm.__version__, torch.__version__],
        "cpu": [_cpu_model(), sorted(os.sched_getaffinity(0))],
        "env": sorted((k, v) for k, v in os.environ.items() if k.startswith(ENV_PREFIXES)),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


class WarmUpRecords:
    """The records file in CACHE_DIR: at most MAX_RECORDS; unreadable or malformed means none."""

    def __init__(self, cache_dir: str, max_age_hours: float) -> None:
        self.path = Path(cache_dir) / RECORD_FILE
        self.max_age_seconds = max_age_hours * 3600

    def _read(self) -> dict[str, Any]:
        try:
            records = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return records if isinstance(records, dict) else {}

    def find(self, key: str) -> tuple[dict[int, float], float] | None:
        """The decode speeds (seconds per token per stream, by batch size) recorded for `key`, and
        their age in seconds; None when there is none recent enough or it is malformed."""
        if self.max_age_seconds <= 0:
            return None
        record = self._read().get(key)
        try:
            age = time.time() - float(record["at"])
            recorded = record["decode_seconds_per_token"].items()
            speeds = {int(size): float(seconds) for size, seconds in recorded}
        except (TypeError, KeyError, ValueError, AttributeError):
            return None
        valid = speeds and all(size > 0 and 0 < seconds < 60 for size, seconds in speeds.items())
        return (speeds, age) if valid and 0 <= age <= self.max_age_seconds else None

    def save(self, key: str, speeds: dict[int, float]) -> None:
        """Keep `speeds` for `key` (atomically; a failure to write only costs the next start a measure)."""
        if self.max_age_seconds <= 0 or not speeds:
            return
        records = self._read()
        records.pop(key, None)
        records[key] = {"at": time.time(), "decode_seconds_per_token": speeds}
        while len(records) > MAX_RECORDS:
            records.pop(next(iter(records)))
        temporary = self.path.with_name(f".{RECORD_FILE}.{os.getpid()}")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            temporary.write_text(json.dumps(records))
            temporary.replace(self.path)
        except OSError as error:
            logger.warning("warm-up: could not keep the decode speeds in %s: %s", self.path, error)
            with contextlib.suppress(OSError):
                temporary.unlink(missing_ok=True)
