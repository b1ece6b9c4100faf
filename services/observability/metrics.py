"""What operators see in /metrics: request latency as the chat stream sees it, and the service's gauges.

vLLM already registers its own engine metrics (`vllm:num_requests_running`,
`vllm:kv_cache_usage_perc`, `vllm:time_to_first_token_seconds`, ...) in
prometheus_client's default REGISTRY of this process; /metrics serves them
unchanged and adds, under `chat_`, what only the app knows: latency as the
chat stream sees it, memory of the whole process tree, sessions, event-loop
lag, the leak slope and maintenance.
"""

from __future__ import annotations

import asyncio
import math
import time
import weakref
from collections.abc import Iterator
from typing import Any, Protocol

import numpy as np
from prometheus_client import Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from services.admission.service import Admission
from services.chat.store import SessionStore
from services.config import Settings
from services.engine import ChatEngine, StreamStats
from services.observability.admission_metrics import admission_metrics
from services.observability.maintenance import Maintenance
from services.observability.memory import PROCESS_KINDS, MemorySample
from services.observability.readiness import readiness_metrics
from services.observability.series import SampleRing

# Buckets as vLLM's own histograms, so chat_* and vllm:* compare bucket by bucket.
LATENCY_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)
FINISH_REASONS = ("stop", "length", "abort", "error")  # anything else is counted as "other"
LATENCY_COLUMNS = ("queue_seconds", "ttft_seconds", "inter_token_seconds", "e2e_seconds", "output_tokens")
PERCENTILES = (50, 95, 99)
LATENCY_SAMPLES_KEPT = 10_000  # recent requests in the ring for /stats percentiles and plots


class RequestMetrics(Collector):
    """App-side timing of every chat request: Prometheus histograms plus a ring for percentiles.

    `record` is the engine's on_finish listener. Queue time is vLLM's own
    per-request measurement (QUEUED to SCHEDULED in the engine core, read
    from `RequestOutput.metrics`); the other times are taken where the app
    receives the stream, so they include IPC and detokenisation.
    """

    def __init__(self, samples_kept: int = LATENCY_SAMPLES_KEPT) -> None:
        def histogram(name: str, doc: str, buckets: tuple = LATENCY_BUCKETS) -> Histogram:
            return Histogram(name, doc, buckets=buckets, registry=None)

        self.queue_time = histogram(
            "chat_request_queue_time_seconds", "Time requests waited in the engine queue (vLLM's measure)."
        )
        self.ttft = histogram(
            "chat_time_to_first_token_seconds", "Time from submitting a request to its first token."
        )
        self.inter_token = histogram(
            "chat_inter_token_latency_seconds", "Mean gap between output tokens, one value per request."
        )
        self.e2e = histogram("chat_e2e_request_latency_seconds", "Time from submitting a request to its end.")
        self.tokens = histogram(
            "chat_request_generation_tokens", "Tokens generated per request.", TOKEN_BUCKETS
        )
        self.finished = Counter(
            "chat_requests_finished", "Chat requests ended, by reason.", ["finished_reason"], registry=None
        )
        self.ring = SampleRing(samples_kept, LATENCY_COLUMNS)

    def record(self, stats: StreamStats) -> None:
        """Observe one finished request (the engine's on_finish listener)."""
        for histogram, value in (
            (self.queue_time, stats.queue_seconds),
            (self.ttft, stats.ttft_seconds),
            (self.inter_token, stats.inter_token_seconds),
            (self.e2e, stats.e2e_seconds),
        ):
            if value is not None:
                histogram.observe(value)
        self.tokens.observe(stats.output_tokens)
        reason = stats.finish_reason if stats.finish_reason in FINISH_REASONS else "other"
        self.finished.labels(reason).inc()
        at = stats.finished_at if stats.finished_at is not None else time.monotonic()
        self.ring.append(
            at,
            {
                "queue_seconds": stats.queue_seconds,
                "ttft_seconds": stats.ttft_seconds,
                "inter_token_seconds": stats.inter_token_seconds,
                "e2e_seconds": stats.e2e_seconds,
                "output_tokens": stats.output_tokens,
            },
        )

    def collect(self) -> Iterator[Metric]:
        for metric in (self.queue_time, self.ttft, self.inter_token, self.e2e, self.tokens, self.finished):
            yield from metric.collect()

    def percentiles(self) -> dict[str, dict[str, float | None]]:
        """P50/P95/P99 of each column over the requests kept in the ring."""
        summary: dict[str, dict[str, float | None]] = {}
        for column in LATENCY_COLUMNS:
            values = self.ring.column(column)
            values = values[~np.isnan(values)]
            summary[column] = {
                f"p{q}": (float(np.percentile(values, q)) if len(values) else None) for q in PERCENTILES
            }
        return summary


class RunningParts(Protocol):
    """The parts that exist while the engine runs (built together at start: services/runtime.py)."""

    @property
    def engine(self) -> ChatEngine: ...

    @property
    def sessions(self) -> SessionStore: ...

    @property
    def admission(self) -> Admission: ...

    @property
    def maintenance(self) -> Maintenance: ...

    @property
    def requests(self) -> RequestMetrics: ...


class ServiceParts(Protocol):
    """What metrics and reports read (services/observability/status.py has it)."""

    settings: Settings

    @property
    def uptime_seconds(self) -> float: ...

    def running(self) -> RunningParts | None: ...

    def status(self) -> dict[str, Any]: ...

    def readiness(self) -> tuple[bool, dict[str, Any]]: ...

    def tier_detail(self, parts: Any) -> dict[str, Any]: ...


class ServiceCollector(Collector):
    """Gauges read from the parts at scrape time (it holds the parts weakly)."""

    def __init__(self, parts: ServiceParts) -> None:
        self._parts = weakref.ref(parts)

    def collect(self) -> Iterator[Metric]:
        parts = self._parts()
        running = parts.running() if parts is not None else None
        ready = parts is not None and parts.readiness()[0]
        tier = parts.tier_detail(running) if parts is not None and running is not None else None
        yield from readiness_metrics(ready, tier)
        if parts is None or running is None:
            return
        engine = running.engine
        sessions = running.sessions
        yield _gauge("chat_engine_alive", "1 while the engine has not errored.", 1 if engine.alive else 0)
        yield _gauge("chat_sessions", "Chat sessions held.", len(sessions))
        yield _gauge("chat_turns_in_flight", "Chat turns generating now.", sessions.turns_in_flight())
        yield _gauge(
            "chat_engine_unfinished_requests", "Requests the engine holds.", engine.unfinished_requests()
        )
        yield _gauge("chat_asyncio_tasks", "Tasks alive in the app's event loop.", _task_count())
        yield _gauge("chat_uptime_seconds", "Seconds since the service started.", parts.uptime_seconds)
        dropped = CounterMetricFamily(
            "chat_sessions_dropped", "Sessions dropped, by reason.", labels=["reason"]
        )
        for reason, count in sessions.dropped_total.items():
            dropped.add_metric([reason], count)
        yield dropped
        yield from admission_metrics(running.admission, sessions.refused_total)
        yield from _maintenance_metrics(running.maintenance, parts.settings.leak_alarm_mb_per_hour)


def _maintenance_metrics(maintenance: Maintenance, alarm_mb_per_hour: float) -> Iterator[Metric]:
    memory = maintenance.memory
    lag = maintenance.loop_lag
    if memory.latest is not None:
        yield from _memory_metrics(memory.latest)
    slope = memory.slope_mb_per_hour
    yield _gauge(
        "chat_memory_growth_mb_per_hour",
        "Theil-Sen slope of the tree's anon+swap memory after warm-up (NaN until enough samples).",
        math.nan if slope is None else slope,
    )
    yield _gauge("chat_memory_leak_alarm", "1 while the growth exceeds LEAK_ALARM_MB_PER_HOUR.", memory.alarm)
    yield _gauge(
        "chat_memory_leak_alarm_threshold_mb_per_hour",
        "LEAK_ALARM_MB_PER_HOUR.",
        alarm_mb_per_hour,
    )
    yield _gauge("chat_event_loop_lag_seconds", "Latest event-loop lag probe.", lag.latest_seconds)
    yield _gauge(
        "chat_event_loop_lag_max_seconds", "Worst event-loop lag in the last minute.", lag.max_seconds
    )
    yield _counter("chat_maintenance_rounds", "Maintenance rounds run.", maintenance.rounds)
    yield _counter(
        "chat_maintenance_expired_sessions",
        "Idle sessions expired by maintenance.",
        maintenance.expired_sessions_total,
    )
    yield _counter(
        "chat_maintenance_aborted_requests",
        "Running requests aborted with expired sessions.",
        maintenance.aborted_requests_total,
    )
    if maintenance.last_round is not None:
        yield _gauge(
            "chat_maintenance_last_duration_seconds",
            "Duration of the latest round.",
            maintenance.last_round.seconds,
        )


def _memory_metrics(sample: MemorySample) -> Iterator[Metric]:
    per_process = GaugeMetricFamily(
        "chat_process_memory_bytes",
        "Memory of the app and each engine process (rss, vms, uss, anon = RssAnon, swap = VmSwap).",
        labels=["process", "kind"],
    )
    for process in sample.processes:
        for kind in PROCESS_KINDS:
            value = getattr(process, kind)
            if value is not None:
                per_process.add_metric([process.role, kind], value)
    yield per_process
    tree = GaugeMetricFamily(
        "chat_process_tree_memory_bytes", "Memory summed over the app and engine processes.", labels=["kind"]
    )
    for kind in ("rss", "uss", "anon_swap"):
        tree.add_metric([kind], sample.tree(kind))
    yield tree
    if sample.gpu_allocated is not None:
        gpu = GaugeMetricFamily("chat_gpu_memory_bytes", "CUDA memory of the app process.", labels=["kind"])
        gpu.add_metric(["allocated"], sample.gpu_allocated)
        gpu.add_metric(["reserved"], sample.gpu_reserved or 0)
        yield gpu
    age = time.monotonic() - sample.at
    yield _gauge("chat_memory_sample_age_seconds", "Age of the latest memory sample.", age)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)


def _task_count() -> int:
    try:
        return len(asyncio.all_tasks())
    except RuntimeError:  # not called from the event loop's thread
        return 0
