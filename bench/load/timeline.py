"""What admission did during a load: every app's /status every few seconds, in one JSONL file.

A verdict's numbers say how people fared; the timeline says why: how many requests the apps ran at
the engine, the running limit, which bound set it (the decode model's `capacity_limit` or the
stream pace's `engine_cap`), the slowdown the model read, and the document parts among them, and
the cores each part of the machine used since the sample before (the engine's against the apps',
the database's, the balancer's, Locust's: what the engine got when a burst ran slowly). Each sample
is one line: seconds since the load began, one entry per app, then the cores by part.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import cores_by_part, cpu_seconds_by_part
from services.admission.pace import lowest

SAMPLE_SECONDS = 10.0
MAX_SAMPLES = 2000  # a bound: over five hours at SAMPLE_SECONDS
FIRST_MINUTE = 60.0  # the summary's cores by part over the load's first minute (its first burst)


def sample_of(status: dict[str, Any]) -> dict[str, Any]:
    """The admission numbers of one app's /status."""
    admission = status.get("admission") or {}
    running = admission.get("running") or {}
    pace = admission.get("stream_pace") or {}
    return {
        "running": sum(running.values()),
        "documents": running.get("document", 0),
        "others_running": admission.get("others_running"),
        "waiting": admission.get("waiting"),
        "limit": admission.get("running_limit"),
        "capacity_limit": admission.get("capacity_limit"),
        "engine_cap": pace.get("engine_cap"),
        "slowest_stream": pace.get("slowest_stream_tokens_per_second"),
        "slowdown": admission.get("slowdown_vs_warm_up"),
    }


class AdmissionTimeline:
    """Samples `statuses()` (one /status per app) in a thread while in its `with` block."""

    def __init__(
        self,
        statuses: Callable[[], list[dict[str, Any]]],
        path: Path,
        every: float = SAMPLE_SECONDS,
        machine: Callable[[], dict[Any, tuple[str, float]]] = cpu_seconds_by_part,
    ) -> None:
        self.statuses = statuses
        self.machine = machine  # CPU seconds so far of every process, with its part
        self.path = path
        self.every = every
        self.samples: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="admission-timeline", daemon=True)
        self._began = 0.0

    def __enter__(self) -> AdmissionTimeline:
        self._began = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=self.every + 30)
        self.path.write_text("".join(json.dumps(sample) + "\n" for sample in self.samples))

    def _run(self) -> None:
        used = self.machine()
        read_at = time.monotonic()
        while not self._stop.wait(self.every) and len(self.samples) < MAX_SAMPLES:
            now = time.monotonic()
            cpu = self.machine()
            cores = cores_by_part(used, cpu, now - read_at)
            used = cpu
            read_at = now
            try:
                apps = [sample_of(status) for status in self.statuses()]
            except Exception:  # an app busy past its timeout: that sample is missing, the next is tried
                continue
            self.samples.append({"seconds": round(now - self._began, 1), "apps": apps, "cores": cores})

    def summary(self) -> dict[str, Any]:
        """Means over the samples: requests the apps ran, document parts among them, the limit and what
        set it (share of samples where the stream pace's cap held it under the model's limit)."""
        rows = [s["apps"] for s in self.samples if s["apps"]]
        if not rows:
            return {"samples": 0}

        def mean(values: list[float]) -> float | None:
            return round(statistics.fmean(values), 2) if values else None

        def lowest_of(apps: list[dict[str, Any]], key: str) -> float | None:
            return lowest(*(app[key] for app in apps))

        limits = [lowest_of(apps, "limit") for apps in rows]
        models = [lowest_of(apps, "capacity_limit") for apps in rows]
        caps = [lowest_of(apps, "engine_cap") for apps in rows]
        slowdowns = [app["slowdown"] for apps in rows for app in apps if app["slowdown"] is not None]
        paced = [c is not None and m is not None and c < m for c, m in zip(caps, models, strict=True)]
        return {
            "samples": len(rows),
            "every_seconds": self.every,
            "app_running_mean": mean([sum(app["running"] for app in apps) for apps in rows]),
            "documents_running_mean": mean([sum(app["documents"] for app in apps) for apps in rows]),
            "limit_mean": mean([x for x in limits if x is not None]),
            "capacity_limit_mean": mean([x for x in models if x is not None]),
            "pace_cap_binding_share": round(sum(paced) / len(rows), 2),
            "slowdown_mean": mean(slowdowns),
            "first_minute_cores_by_part": self.first_minute_cores(),
        }

    def first_minute_cores(self) -> dict[str, float]:
        """Cores each part used over the samples of the load's first minute (what its burst got)."""
        first = [s["cores"] for s in self.samples if s["seconds"] <= FIRST_MINUTE + self.every / 2]
        parts = sorted({part for cores in first for part in cores})
        return {part: round(statistics.fmean(c.get(part, 0.0) for c in first), 2) for part in parts}
