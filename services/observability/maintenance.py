"""The maintenance loop: expire idle sessions, collect garbage, give memory back, sample memory, probe lag.

`Maintenance` owns three background tasks, started with the app and cancelled on stop:

- a round every MAINTENANCE_INTERVAL_SECONDS: expire idle sessions (cancelling
  their turns aborts their engine requests), `gc.collect()`,
  `torch.cuda.empty_cache()` under CUDA, `malloc_trim(0)` on glibc; one log line;
- a memory sample every MEMORY_SAMPLE_SECONDS of the app process and every
  engine process (see memory.py);
- an event-loop lag probe, so a blocking call anywhere shows up as lag.
"""

from __future__ import annotations

import asyncio
import ctypes
import functools
import gc
import logging
import platform
import sys
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import psutil

from services.chat.store import SessionStore
from services.config import Settings
from services.engine import ChatEngine
from services.memory import glibc_counters, jemalloc_counters, settle_native_caches
from services.observability.memory import (
    MB,
    MemoryMonitor,
    MemorySample,
    gpu_memory,
    kv_cache_usage,
    process_tree_memory,
)

logger = logging.getLogger(__name__)

# Probe the event loop 4 times a second and keep one minute of probes.
LOOP_LAG_PROBE_SECONDS = 0.25
LOOP_LAG_PROBES_KEPT = 240


@functools.cache
def _glibc() -> Any:
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def malloc_trim() -> bool | None:
    """Give free heap pages back to the OS (glibc); True if some were released, None if unsupported.

    ctypes releases the GIL during the call: run it in a thread.
    """
    libc = _glibc()
    return None if libc is None else bool(libc.malloc_trim(0))


def malloc_info() -> dict[str, int] | None:
    """This process's malloc totals (jemalloc's when preloaded, else glibc's), or None (tcmalloc).

    in_use: what the program holds; free_in_heaps: what malloc keeps resident beyond that
    (glibc: free chunks inside its heaps, which malloc_trim can only partly return; jemalloc:
    resident - allocated, its metadata and pages not yet decayed included); mmapped: glibc's
    large blocks, or all jemalloc has mapped. Python's small objects live in its own arenas.
    """
    jemalloc = jemalloc_counters()
    if jemalloc:
        return {
            "in_use_bytes": jemalloc["jemalloc.allocated"],
            "free_in_heaps_bytes": jemalloc["jemalloc.resident"] - jemalloc["jemalloc.allocated"],
            "mmapped_bytes": jemalloc["jemalloc.mapped"],
        }
    counters = glibc_counters()
    if not counters:
        return None
    return {
        "in_use_bytes": counters["glibc.in_use"],
        "free_in_heaps_bytes": counters["glibc.free"],
        "mmapped_bytes": counters["glibc.mmapped"],
    }


def _cancelling_tasks() -> int:
    return sum(1 for task in asyncio.all_tasks() if task.cancelling() and not task.done())


# --- event loop lag ---------------------------------------------------------------
class LoopLagMonitor:
    """How late the event loop wakes a sleeper: the cost of anything that blocks it."""

    def __init__(self, probe_seconds: float = LOOP_LAG_PROBE_SECONDS, kept: int = LOOP_LAG_PROBES_KEPT):
        self.probe_seconds = probe_seconds
        self._recent: deque[float] = deque(maxlen=kept)
        self.latest_seconds = 0.0

    def observe(self, lag_seconds: float) -> None:
        self.latest_seconds = lag_seconds
        self._recent.append(lag_seconds)

    @property
    def max_seconds(self) -> float:
        """The worst lag among the kept probes (the last minute by default)."""
        return max(self._recent, default=0.0)

    def percentile(self, q: float) -> float:
        return float(np.percentile(self._recent, q)) if self._recent else 0.0

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            expected = loop.time() + self.probe_seconds
            await asyncio.sleep(self.probe_seconds)
            self.observe(max(0.0, loop.time() - expected))


# --- the maintenance loop ---------------------------------------------------------
@dataclass(frozen=True)
class RoundReport:
    """What one maintenance round freed and what it cost."""

    expired_sessions: int
    aborted_requests: int
    gc_collected: int
    malloc_trimmed: bool | None
    rss_before: int
    rss_after: int
    seconds: float
    gc_seconds: float

    def log_line(self) -> str:
        trim = {None: "unsupported", True: "released memory", False: "nothing to release"}
        return (
            f"maintenance: expired {self.expired_sessions} idle session(s) "
            f"({self.aborted_requests} running request(s) aborted), gc collected {self.gc_collected} "
            f"object(s) in {self.gc_seconds * 1000:.0f} ms, malloc_trim {trim[self.malloc_trimmed]}, "
            f"app RSS {self.rss_before / MB:.1f} -> {self.rss_after / MB:.1f} MB "
            f"({(self.rss_after - self.rss_before) / MB:+.1f}), took {self.seconds * 1000:.0f} ms"
        )


class Maintenance:
    """Owns the maintenance, memory-sampling and loop-lag tasks for the life of the runtime."""

    def __init__(
        self,
        settings: Settings,
        sessions: SessionStore,
        engine: ChatEngine,
        extra_steps: Sequence[Callable[[], Awaitable[object]]] = (),
    ) -> None:
        self.settings = settings
        self.sessions = sessions
        self.engine = engine
        self.extra_steps = tuple(extra_steps)  # owners' own round work (e.g. history retention)
        self.memory = MemoryMonitor(settings)
        self.loop_lag = LoopLagMonitor()
        self.rounds = 0
        self.expired_sessions_total = 0
        self.aborted_requests_total = 0
        self.last_round: RoundReport | None = None
        self._process = psutil.Process()
        self._tasks: list[asyncio.Task] = []

    def add_steps(self, *steps: Callable[[], Awaitable[object]]) -> None:
        """More round work from now on (a model the vLLM servers listed after the start)."""
        self.extra_steps = (*self.extra_steps, *steps)

    def start(self) -> None:
        """Settle slow-filling library caches, freeze the start-up heap, start the three loops (once).

        numpy's buffer cache (native_caches.py) is filled before the freeze, so it
        is part of the start-up heap.

        After imports and engine start-up the app holds millions of long-lived
        objects (torch, transformers, vLLM); a full `gc.collect()` walking them
        blocks the event loop for a long time (BENCHMARKS.md). Frozen, they are skipped, and a
        round only walks what was allocated while serving (vLLM's EngineCore
        does the same for its own heap).
        """
        if self._tasks:
            return
        settle_native_caches()
        gc.collect()
        gc.freeze()
        self._tasks = [
            asyncio.create_task(
                self._every(
                    self.settings.maintenance_interval_seconds,
                    self.run_round,
                    first_after=self.settings.maintenance_interval_seconds,
                ),
                name="maintenance-rounds",
            ),
            asyncio.create_task(
                self._every(self.settings.memory_sample_seconds, self.sample_memory),
                name="maintenance-memory",
            ),
            asyncio.create_task(self.loop_lag.run(), name="maintenance-loop-lag"),
        ]

    async def stop(self) -> None:
        """Cancel the loops and wait for them to end (idempotent)."""
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if tasks:
            gc.unfreeze()

    async def _every(self, seconds: float, action: Callable, first_after: float = 0.0) -> None:
        await asyncio.sleep(first_after)
        while True:
            started = time.monotonic()
            try:
                await action()
            except Exception:  # one failed round must not end maintenance
                logger.exception("maintenance step %s failed", getattr(action, "__name__", action))
            await asyncio.sleep(max(0.0, seconds - (time.monotonic() - started)))

    async def run_round(self) -> RoundReport:
        """Expire idle sessions (aborting their requests), collect garbage, give memory back."""
        started = time.perf_counter()
        rss_before = self._process.memory_info().rss
        # Expiring a session cancels its running turn, which aborts its engine request.
        # expire() reports only a count, and is synchronous: the turns it cancelled are
        # exactly the tasks that started cancelling during the call.
        cancelling_before = _cancelling_tasks()
        expired = self.sessions.expire()
        aborted = _cancelling_tasks() - cancelling_before
        for step in self.extra_steps:
            try:
                await step()
            except Exception:  # one failed step must not cost the round its gc and trim
                logger.exception("maintenance step %s failed", getattr(step, "__name__", step))
        gc_started = time.perf_counter()
        collected = gc.collect()
        gc_seconds = time.perf_counter() - gc_started
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.empty_cache()
        trimmed = await asyncio.to_thread(malloc_trim)
        report = RoundReport(
            expired_sessions=expired,
            aborted_requests=aborted,
            gc_collected=collected,
            malloc_trimmed=trimmed,
            rss_before=rss_before,
            rss_after=self._process.memory_info().rss,
            seconds=time.perf_counter() - started,
            gc_seconds=gc_seconds,
        )
        self.rounds += 1
        self.expired_sessions_total += expired
        self.aborted_requests_total += aborted
        self.last_round = report
        logger.info("%s", report.log_line())
        return report

    async def sample_memory(self) -> MemorySample:
        """Take one memory sample of the process tree and the counts, and record it."""
        processes = await asyncio.to_thread(process_tree_memory, self._process)
        gpu = gpu_memory()
        sample = MemorySample(
            at=time.monotonic(),
            processes=processes,
            gpu_allocated=gpu[0] if gpu else None,
            gpu_reserved=gpu[1] if gpu else None,
            kv_cache_usage=kv_cache_usage(),
            sessions=len(self.sessions),
            engine_unfinished_requests=self.engine.unfinished_requests(),
            turns_in_flight=self.sessions.turns_in_flight(),
            asyncio_tasks=len(asyncio.all_tasks()),
            event_loop_lag_seconds=self.loop_lag.max_seconds,
            requests_total=self.engine.requests_finished_total,
        )
        self.memory.record(sample)
        return sample
