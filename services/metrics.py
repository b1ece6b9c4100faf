"""What operators see: request latency, /metrics, /healthz, /stats, and the /stats chat report.

vLLM already registers its own engine metrics (`vllm:num_requests_running`,
`vllm:kv_cache_usage_perc`, `vllm:time_to_first_token_seconds`, ...) in
prometheus_client's default REGISTRY of this process; /metrics serves them
unchanged and adds, under `chat_`, what only the app knows: latency as the
chat stream sees it, memory of the whole process tree, sessions, event-loop
lag, the leak slope and maintenance.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import math
import os
import sys
import time
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
from fastapi import Depends, FastAPI, Header, HTTPException
from fastapi.responses import JSONResponse, Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.routing import BaseRoute

from services import plots
from services.chainlit_state import chainlit_session_counts
from services.engine import StreamStats, sanitize
from services.maintenance import MB, PROCESS_KINDS, SampleRing

if TYPE_CHECKING:
    from services.runtime import Runtime

logger = logging.getLogger(__name__)

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


class RequestMetrics(Collector):
    """App-side timing of every chat request: Prometheus histograms plus a ring for percentiles.

    `record` is the engine's on_finish listener. Queue time is vLLM's own
    per-request measurement (QUEUED to SCHEDULED in the engine core, read
    from `RequestOutput.metrics`); the other times are taken where the app
    receives the stream, so they include IPC and detokenisation.
    """

    def __init__(self, samples_kept: int) -> None:
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


class ServiceCollector(Collector):
    """Gauges read from the runtime at scrape time (it holds the runtime weakly)."""

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = weakref.ref(runtime)

    def collect(self) -> Iterator[Metric]:
        runtime = self._runtime()
        ready = runtime is not None and runtime.ready
        yield _gauge("chat_ready", "1 once the engine and sessions are up.", 1 if ready else 0)
        if not ready or runtime is None:
            return
        engine, sessions, maintenance = runtime.engine, runtime.sessions, runtime.maintenance
        assert engine is not None and sessions is not None
        yield _gauge("chat_engine_alive", "1 while the engine has not errored.", 1 if engine.alive else 0)
        yield _gauge("chat_sessions", "Chat sessions held.", len(sessions))
        yield _gauge("chat_turns_in_flight", "Chat turns generating now.", sessions.turns_in_flight())
        yield _gauge(
            "chat_engine_unfinished_requests", "Requests the engine holds.", engine.unfinished_requests()
        )
        yield _gauge("chat_asyncio_tasks", "Tasks alive in the app's event loop.", _task_count())
        yield _gauge("chat_uptime_seconds", "Seconds since the runtime started.", runtime.uptime_seconds)
        dropped = CounterMetricFamily(
            "chat_sessions_dropped", "Sessions dropped, by reason.", labels=["reason"]
        )
        for reason, count in sessions.dropped_total.items():
            dropped.add_metric([reason], count)
        yield dropped
        chainlit = GaugeMetricFamily(
            "chat_chainlit_dict_entries", "Entries in Chainlit's per-session dicts.", labels=["dict"]
        )
        for name, count in chainlit_session_counts().items():
            chainlit.add_metric([name.removeprefix("chainlit_")], count)
        yield chainlit
        if maintenance is not None:
            yield from _maintenance_metrics(runtime)


def _maintenance_metrics(runtime: Runtime) -> Iterator[Metric]:
    maintenance = runtime.maintenance
    assert maintenance is not None and runtime.settings is not None
    memory, lag = maintenance.memory, maintenance.loop_lag
    sample = memory.latest
    if sample is not None:
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
            "chat_process_tree_memory_bytes",
            "Memory summed over the app and engine processes.",
            labels=["kind"],
        )
        for kind in ("rss", "uss", "anon_swap"):
            tree.add_metric([kind], sample.tree(kind))
        yield tree
        if sample.gpu_allocated is not None:
            gpu = GaugeMetricFamily(
                "chat_gpu_memory_bytes", "CUDA memory of the app process.", labels=["kind"]
            )
            gpu.add_metric(["allocated"], sample.gpu_allocated)
            gpu.add_metric(["reserved"], sample.gpu_reserved or 0)
            yield gpu
        yield _gauge(
            "chat_memory_sample_age_seconds", "Age of the latest memory sample.", time.monotonic() - sample.at
        )
    slope = memory.slope_mb_per_hour
    yield _gauge(
        "chat_memory_growth_mb_per_hour",
        "Theil-Sen slope of the tree's anon+swap memory after warm-up (NaN until enough samples).",
        math.nan if slope is None else slope,
    )
    yield _gauge(
        "chat_memory_leak_alarm",
        "1 while the growth exceeds LEAK_ALARM_MB_PER_HOUR.",
        1 if memory.alarm else 0,
    )
    yield _gauge(
        "chat_memory_leak_alarm_threshold_mb_per_hour",
        "LEAK_ALARM_MB_PER_HOUR.",
        runtime.settings.leak_alarm_mb_per_hour,
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


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)


def _task_count() -> int:
    try:
        return len(asyncio.all_tasks())
    except RuntimeError:  # not called from the event loop's thread
        return 0


# --- exposition -------------------------------------------------------------------
def prometheus_text(runtime: Runtime) -> bytes:
    """vLLM's metrics (default REGISTRY: process, GC, vllm:*) followed by the app's chat_* metrics."""
    return generate_latest(REGISTRY) + generate_latest(runtime.registry)


def _mb(value: float | None) -> float | None:
    return None if value is None else round(value / MB, 1)


def stats_summary(runtime: Runtime) -> dict[str, Any]:
    """The JSON of GET /stats: latency percentiles, memory now and its slope, counts, uptime."""
    summary: dict[str, Any] = {"ready": runtime.ready, "uptime_seconds": round(runtime.uptime_seconds, 1)}
    if not runtime.ready:
        return summary
    summary.update(runtime.status())
    if runtime.requests is not None:
        summary["requests"] = {"kept": len(runtime.requests.ring), **runtime.requests.percentiles()}
    maintenance = runtime.maintenance
    if maintenance is None or runtime.settings is None:
        return summary
    memory, sample = maintenance.memory, maintenance.memory.latest
    slope = memory.slope_mb_per_hour
    summary["memory"] = {
        "samples": len(memory.ring),
        "growth_mb_per_hour": None if slope is None else round(slope, 2),
        "leak_alarm": memory.alarm,
        "leak_alarm_mb_per_hour": runtime.settings.leak_alarm_mb_per_hour,
    }
    if sample is not None:
        summary["memory"].update(
            {
                "sampled_seconds_ago": round(time.monotonic() - sample.at, 1),
                "processes": [
                    {"role": p.role, "pid": p.pid, **{f"{k}_mb": _mb(getattr(p, k)) for k in PROCESS_KINDS}}
                    for p in sample.processes
                ],
                "tree_mb": {k: _mb(sample.tree(k)) for k in ("rss", "uss", "anon_swap")},
                "gpu_mb": {"allocated": _mb(sample.gpu_allocated), "reserved": _mb(sample.gpu_reserved)},
                "kv_cache_usage": sample.kv_cache_usage,
            }
        )
    lag = maintenance.loop_lag
    summary["event_loop_lag_seconds"] = {
        "latest": round(lag.latest_seconds, 4),
        "p99_last_minute": round(lag.percentile(99), 4),
        "max_last_minute": round(lag.max_seconds, 4),
    }
    last = maintenance.last_round
    summary["maintenance"] = {
        "rounds": maintenance.rounds,
        "expired_sessions_total": maintenance.expired_sessions_total,
        "aborted_requests_total": maintenance.aborted_requests_total,
        "last_round": None if last is None else {
            "expired_sessions": last.expired_sessions, "aborted_requests": last.aborted_requests,
            "gc_collected": last.gc_collected, "seconds": round(last.seconds, 4),
        },
    }  # fmt: skip
    return summary


# --- the /stats chat command ----------------------------------------------------------
# Points drawn per series: a full ring (10,000 requests) took ~2.5 s to draw here.
PLOT_MAX_POINTS = 1000
PLOT_TIMEOUT_SECONDS = 60.0
LATENCY_ROWS = (
    ("Queue time", "queue_seconds"),
    ("Time to first token", "ttft_seconds"),
    ("Inter-token latency", "inter_token_seconds"),
    ("End-to-end", "e2e_seconds"),
)


async def render_stats_report(runtime: Runtime) -> tuple[str, bytes]:
    """Markdown with the key numbers, and a PNG plot of memory per process and latency over time.

    The data is copied here; the plot is drawn by a short-lived child process
    (services/plots.py), so matplotlib never lives in the app. One at a time.
    If drawing fails, the PNG is empty and the text says so.
    """
    text = _report_text(runtime)
    now = time.monotonic()
    memory_plot: dict[str, np.ndarray] = {}
    memory_times = latency_times = np.empty(0)
    ttft = e2e = np.empty(0)
    if runtime.maintenance is not None:
        memory = runtime.maintenance.memory
        keep = _evenly_spaced(len(memory.ring))
        memory_times = memory.ring.times()[keep]
        memory_plot = {role: values[keep] for role, values in memory.process_series("rss").items()}
        memory_plot[plots.WHOLE_TREE] = memory.ring.column("tree_anon_swap")[keep]
    if runtime.requests is not None:
        ring = runtime.requests.ring
        keep = _evenly_spaced(len(ring))
        latency_times = ring.times()[keep]
        ttft, e2e = ring.column("ttft_seconds")[keep], ring.column("e2e_seconds")[keep]
    latency = {"time to first token": ttft, "end-to-end": e2e}
    data = plots.encode(now, memory_times, memory_plot, latency_times, latency)
    async with runtime.render_lock:
        try:
            png = await _run_plot_process(data)
        except (OSError, RuntimeError, TimeoutError) as error:  # the numbers still help without a plot
            logger.warning("stats plot failed: %s", sanitize(str(error)))
            return text + "\n\n_(The plot could not be drawn; see the server log.)_", b""
    return text, png


async def _run_plot_process(data: bytes) -> bytes:
    """Run services/plots.py on `data`; kill it on timeout or cancellation."""
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-I", plots.__file__,  # -I: the services folder must not shadow modules
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "MPLBACKEND": "Agg"},
    )  # fmt: skip
    try:
        async with asyncio.timeout(PLOT_TIMEOUT_SECONDS):
            png, errors = await child.communicate(data)
    finally:
        if child.returncode is None:
            child.kill()
            await child.wait()
    if child.returncode != 0 or not png.startswith(b"\x89PNG"):
        raise RuntimeError(
            f"plot process failed ({child.returncode}): {errors.decode(errors='replace')[-500:]}"
        )
    return png


def _evenly_spaced(count: int, limit: int = PLOT_MAX_POINTS) -> np.ndarray:
    """Indices of at most `limit` rows spread over `count`, newest included."""
    return np.unique(np.linspace(0, count - 1, min(count, limit)).round().astype(int))


def _seconds(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


def _report_text(runtime: Runtime) -> str:
    summary = stats_summary(runtime)
    if not summary.get("ready"):
        return "**Service stats**: not ready yet."
    lines = [f"**Service stats** (up {_duration(summary['uptime_seconds'])})", ""]
    requests = summary.get("requests")
    if requests:
        lines += [f"Requests kept: {requests['kept']:,}", "", "| | P50 | P95 | P99 |", "|---|---|---|---|"]
        for label, key in LATENCY_ROWS:
            cells = [_seconds(requests[key][f"p{q}"]) for q in PERCENTILES]
            lines.append(f"| {label} | {' | '.join(cells)} |")
        tokens = [requests["output_tokens"][f"p{q}"] for q in PERCENTILES]
        cells = ["–" if value is None else f"{value:.0f}" for value in tokens]
        lines.append(f"| Tokens out | {' | '.join(cells)} |")
    memory = summary.get("memory")
    if memory:
        lines.append("")
        if "processes" in memory:
            per_process = ", ".join(f"{p['role']} {p['rss_mb']:,.0f} MB" for p in memory["processes"])
            tree = memory["tree_mb"]["anon_swap"]
            lines.append(f"Memory (RSS): {per_process}; whole tree anon+swap {tree:,.0f} MB.")
        growth = memory["growth_mb_per_hour"]
        alarm = " ⚠️ **leak alarm**" if memory["leak_alarm"] else ""
        lines.append(
            "Growth: still collecting samples after warm-up."
            if growth is None
            else f"Growth: {growth:+.1f} MB/hour (alarm above {memory['leak_alarm_mb_per_hour']:g}){alarm}."
        )
    lag = summary.get("event_loop_lag_seconds", {})
    lines.append(
        f"Sessions {summary['sessions']} · turns in flight {summary['turns_in_flight']} · engine requests "
        f"{summary['engine_unfinished_requests']} · loop lag max {_seconds(lag.get('max_last_minute'))}."
    )
    return "\n".join(lines)


def _duration(seconds: float) -> str:
    minutes = int(seconds // 60)
    if minutes >= 60:
        return f"{minutes // 60} h {minutes % 60} min"
    return f"{minutes} min {int(seconds % 60)} s"


# --- routes -------------------------------------------------------------------------
def install_routes(app: FastAPI, runtime: Runtime) -> None:
    """Add GET /status, /metrics, /healthz and /stats in front of Chainlit's catch-all page route.

    With OPS_TOKEN set, all but /healthz answer 401 without `Authorization: Bearer <token>`.
    """

    def operators_only(authorization: str = Header(default="")) -> None:
        expected = runtime.settings.ops_token
        if expected and not hmac.compare_digest(authorization.encode(), f"Bearer {expected}".encode()):
            challenge = {"WWW-Authenticate": "Bearer"}
            raise HTTPException(401, "needs Authorization: Bearer <OPS_TOKEN>", challenge)

    async def status_route() -> JSONResponse:
        return JSONResponse(runtime.status())

    async def metrics_route() -> Response:
        return Response(prometheus_text(runtime), media_type=CONTENT_TYPE_LATEST)

    async def healthz_route() -> JSONResponse:
        healthy, detail = await runtime.health()
        return JSONResponse(detail, status_code=200 if healthy else 503)

    async def stats_route() -> JSONResponse:
        return JSONResponse(stats_summary(runtime))

    before = len(app.router.routes)
    guarded = [Depends(operators_only)]
    for path, endpoint, dependencies in (
        ("/status", status_route, guarded),
        ("/metrics", metrics_route, guarded),
        ("/healthz", healthz_route, []),
        ("/stats", stats_route, guarded),
    ):
        app.add_api_route(path, endpoint, methods=["GET"], include_in_schema=False, dependencies=dependencies)
    _move_to_front(app, app.router.routes[before:])


def _move_to_front(app: FastAPI, routes: list[BaseRoute]) -> None:
    # Chainlit serves its page for every unknown path; routes added after
    # import would never be reached (see FIELD_NOTES), so they go first.
    for route in routes:
        app.router.routes.remove(route)
    app.router.routes[0:0] = routes
