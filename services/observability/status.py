"""What GET /status, /healthz, /readyz and /livez say: counts that show whether anything is held that
should not be, whether the engine answers, and whether this replica can serve pages (readiness.py)."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable
from typing import Any, Protocol

import psutil

from services.chat.service import ChatService
from services.config import Settings
from services.engine.backends.local import is_running
from services.history.service import History
from services.memory import pymalloc_counters
from services.observability.maintenance import malloc_info
from services.observability.metrics import RunningParts
from services.observability.readiness import SOME, database_detail, engine_tier, liveness, readiness

# /healthz counts an engine that produced output this recently as answering, without a ping.
HEALTH_RECENT_OUTPUT_SECONDS = 30.0


class RunningService(RunningParts, Protocol):
    """The running parts /status and /healthz read besides those of the metrics."""

    @property
    def chat(self) -> ChatService: ...

    @property
    def engine_processes(self) -> list[psutil.Process]: ...


class ServiceStatus:
    """The /status counts and the /healthz verdict of one service; `running` gives its parts while
    the engine runs (None before start and after stop)."""

    def __init__(
        self, settings: Settings, history: History | None, running: Callable[[], RunningService | None]
    ) -> None:
        self.settings = settings
        self.history = history
        self.running = running
        self.started_at = time.time()
        self.draining = False  # set when the replica begins to stop: /readyz says not ready from then
        self._ping: asyncio.Task | None = None  # one health ping shared by concurrent checks

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        """(ready, detail) for /readyz: can this replica serve pages (readiness.py); never the engine."""
        state = self.history.database_state if self.history is not None else "none"
        return readiness(self.running() is not None, self.draining, state)

    def liveness(self) -> tuple[bool, dict[str, Any]]:
        """(alive, detail) for /livez: the loop answered this; an in-process engine's processes run."""
        parts = self.running()
        if parts is None:  # starting (the port opens after the start) or stopping
            return True, {"status": "alive"}
        return liveness(parts.engine.alive, all(is_running(p) for p in parts.engine_processes))

    def tier_detail(self, parts: RunningService) -> dict[str, Any]:
        """The engine tier and the database, as /healthz's detail and the gauges show them."""
        engine = parts.engine
        alive = engine.alive and all(is_running(p) for p in parts.engine_processes)
        return {
            "engine_servers": engine_tier(engine.backend, alive, time.monotonic()).detail(),
            "database": database_detail(self.history, parts.admission.shared),
        }

    @property
    def uptime_seconds(self) -> float:
        return time.time() - self.started_at

    def status(self) -> dict[str, Any]:
        """Counts that show whether anything is held that should not be."""
        parts = self.running()
        if parts is None:
            return {"ready": False}
        engine = parts.engine
        sessions = parts.sessions
        maintenance = parts.maintenance
        summaries = parts.chat.summarizer.cache
        return {
            "ready": True,
            "engine_alive": engine.alive,
            "engine_unfinished_requests": engine.unfinished_requests(),
            "engine_load": {"running": engine.load.running, "waiting": engine.load.waiting},
            "sessions": len(sessions),
            "sessions_awaiting_reconnect": sessions.awaiting_reconnect(),
            "turns_in_flight": sessions.turns_in_flight(),
            "sessions_dropped_total": dict(sessions.dropped_total),
            "sessions_refused_total": sessions.refused_total,
            "summary_cache": {"entries": len(summaries), "bytes": summaries.size_bytes},
            "history": self.history.status() if self.history is not None else {"enabled": False},
            "uptime_seconds": round(self.uptime_seconds, 1),
            "admission": parts.admission.status(),
            **({"warm_up": engine.warm_up_report.summary()} if engine.warm_up_report is not None else {}),
            "maintenance_rounds": maintenance.rounds,
            "memory_growth_mb_per_hour": maintenance.memory.slope_mb_per_hour,
            "memory_leak_alarm": maintenance.memory.alarm,
            "event_loop_lag_max_seconds": round(maintenance.loop_lag.max_seconds, 4),
            "app_malloc": malloc_info(),
            "app_python_allocated_blocks": sys.getallocatedblocks(),
            "app_pymalloc": pymalloc_counters(),
            "app_asyncio_tasks": len(asyncio.all_tasks()),
            "app_tokenizer_copies": _tokenizer_copies(parts),
        }

    async def health(self) -> tuple[bool, dict[str, Any]]:
        """(healthy, detail) for /healthz; detail["status"]: "ok", "overloaded", "degraded" or "down".

        Down: not started or warming up, or the engine is dead or does not answer.
        Degraded: some of the model servers (ENGINE_URLS, or a router's) do not answer.
        Overloaded: serving, but turns wait in our queue or were refused for capacity
        lately. /healthz answers 503 only when it is down; balancers route on /readyz.
        """
        parts = self.running()
        healthy, detail = await self._engine_health(parts)
        if parts is None:
            return False, {"status": "down", **detail}
        detail.update(self.tier_detail(parts))
        if not healthy:
            return False, {"status": "down", **detail}
        if detail["engine_servers"]["state"] == SOME:
            return True, {"status": "degraded", **detail}
        return True, {"status": "overloaded" if parts.admission.overloaded else "ok", **detail}

    async def _engine_health(self, parts: RunningService | None) -> tuple[bool, dict[str, Any]]:
        """The engine is alive, its processes run, and it answers.

        "Answers" means it produced output in the last HEALTH_RECENT_OUTPUT_SECONDS,
        or a one-token ping succeeds now (concurrent checks share one ping).
        """
        if parts is None:
            return False, {"ready": False}
        engine = parts.engine
        processes = {p.pid: is_running(p) for p in parts.engine_processes}
        detail: dict[str, Any] = {
            "ready": True,
            "engine_alive": engine.alive,
            "engine_processes": [{"pid": pid, "running": running} for pid, running in processes.items()],
            "engine_unfinished_requests": engine.unfinished_requests(),
            "engine_load": {"running": engine.load.running, "waiting": engine.load.waiting},
        }
        if not engine.alive or not all(processes.values()):
            return False, {**detail, "error": "the engine process is not running"}
        try:
            await engine.check_health()
        except Exception as error:
            return False, {**detail, "error": f"engine check failed: {type(error).__name__}"}
        age = None if engine.last_output_at is None else time.monotonic() - engine.last_output_at
        if age is not None and age <= HEALTH_RECENT_OUTPUT_SECONDS:
            return True, {**detail, "last_output_seconds_ago": round(age, 2)}
        if self._ping is None or self._ping.done():
            timeout = self.settings.health_ping_timeout_seconds
            self._ping = asyncio.create_task(engine.ping(timeout), name="healthz-ping")
        try:
            seconds = await asyncio.shield(self._ping)
        except Exception as error:
            return False, {**detail, "error": f"engine did not answer a ping: {type(error).__name__}"}
        return True, {**detail, "ping_seconds": round(seconds, 3)}

    async def close(self) -> None:
        """Cancel a health ping in flight (before the engine stops)."""
        if self._ping is not None:
            self._ping.cancel()
            await asyncio.gather(self._ping, return_exceptions=True)
            self._ping = None


def _tokenizer_copies(parts: RunningService) -> int | None:
    """Tokenizer copies alive in vLLM's pool (~8 MB each with the default model); None if unknown."""
    word_caches = parts.engine.word_caches
    return word_caches.copies_alive if word_caches is not None else None
