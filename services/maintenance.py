"""Keeping memory flat and visible: maintenance rounds, process-tree memory samples, the leak alarm.

`Maintenance` owns three background tasks, started with the app and cancelled on stop:

- a round every MAINTENANCE_INTERVAL_SECONDS: expire idle sessions (cancelling
  their turns aborts their engine requests), `gc.collect()`,
  `torch.cuda.empty_cache()` under CUDA, `malloc_trim(0)` on glibc; one log line;
- a memory sample every MEMORY_SAMPLE_SECONDS of the app process and every
  engine child process (vLLM runs EngineCore and its workers as separate
  processes), kept in a ring allocated once, plus the leak slope over them;
- an event-loop lag probe, so a blocking call anywhere shows up as lag.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import gc
import logging
import math
import platform
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.ma  # np.median/np.unique import it on first use: not mid-serving
import psutil

from services.config import Settings

if TYPE_CHECKING:
    from services.engine import ChatEngine
    from services.sessions import SessionStore

logger = logging.getLogger(__name__)

MB = 1024 * 1024
# Probe the event loop 4 times a second and keep one minute of probes.
LOOP_LAG_PROBE_SECONDS = 0.25
LOOP_LAG_PROBES_KEPT = 240
# Process slots in the memory ring: app, EngineCore, workers, helpers; the rest share "other".
MAX_TRACKED_PROCESSES = 8
PROCESS_KINDS = ("rss", "vms", "uss", "anon", "swap")
# Theil-Sen is O(n^2) in points: a window is thinned to this many evenly spaced samples.
LEAK_SLOPE_MAX_POINTS = 160  # ~1 ms per slope here
# A slope needs this many samples covering at least half the window, or one bump looks like a trend.
LEAK_SLOPE_MIN_POINTS = 10
LEAK_SLOPE_MIN_WINDOW_SHARE = 0.5
LEAK_ALARM_REPEAT_SECONDS = 600.0  # while the alarm stays on, warn again this often
KV_CACHE_GAUGE = "vllm:kv_cache_usage_perc"
SAMPLE_FIELDS = (
    "tree_rss", "tree_uss", "tree_anon_swap", "gpu_allocated", "gpu_reserved", "kv_cache_usage",
    "sessions", "engine_unfinished_requests", "turns_in_flight", "asyncio_tasks", "event_loop_lag_seconds",
)  # fmt: skip


# --- ring buffer ----------------------------------------------------------------
class SampleRing:
    """A fixed-size ring of float rows, allocated once: its memory never grows.

    Preallocating matters here: a deque of sample objects would itself grow
    for hours until full, and the leak slope would measure the monitor.
    """

    def __init__(self, capacity: int, columns: Sequence[str]) -> None:
        self.capacity = capacity
        self.columns = tuple(columns)
        self._column = {name: i for i, name in enumerate(self.columns)}
        self._times = np.full(capacity, np.nan)
        self._rows = np.full((capacity, len(self.columns)), np.nan)
        self._next = 0
        self._count = 0

    def append(self, at: float, values: Mapping[str, float | None]) -> None:
        """Store one row taken at time `at`; unknown names are an error, missing ones NaN."""
        row = self._rows[self._next]
        row.fill(np.nan)
        for name, value in values.items():
            row[self._column[name]] = np.nan if value is None else value
        self._times[self._next] = at
        self._next = (self._next + 1) % self.capacity
        self._count = min(self._count + 1, self.capacity)

    def __len__(self) -> int:
        return self._count

    @property
    def nbytes(self) -> int:
        return self._times.nbytes + self._rows.nbytes

    def _order(self) -> np.ndarray:
        start = (self._next - self._count) % self.capacity
        return (start + np.arange(self._count)) % self.capacity

    def times(self) -> np.ndarray:
        """Times of the stored rows, oldest first (a copy)."""
        return self._times[self._order()]

    def column(self, name: str) -> np.ndarray:
        """One column, oldest first (a copy)."""
        return self._rows[self._order(), self._column[name]]


# --- measuring ------------------------------------------------------------------
@dataclass(frozen=True)
class ProcessMemory:
    """Memory of one process in bytes; None where the platform cannot tell."""

    pid: int
    role: str
    rss: int
    vms: int
    uss: int | None
    anon: int | None
    swap: int | None

    @property
    def anon_swap(self) -> int:
        """Private heap in RAM plus swap: where leaks show (and hide). RSS where unknown."""
        if self.anon is None:
            return self.rss + (self.swap or 0)
        return self.anon + (self.swap or 0)


@dataclass(frozen=True)
class MemorySample:
    """One look at the whole process tree and the service's counts."""

    at: float
    processes: tuple[ProcessMemory, ...]
    gpu_allocated: int | None = None
    gpu_reserved: int | None = None
    kv_cache_usage: float | None = None
    sessions: int = 0
    engine_unfinished_requests: int = 0
    turns_in_flight: int = 0
    asyncio_tasks: int = 0
    event_loop_lag_seconds: float = 0.0

    def tree(self, kind: str) -> int:
        """Sum over the tree of `kind` (rss, uss, anon_swap, ...), unknown values as 0."""
        return sum(getattr(p, kind) or 0 for p in self.processes)

    def values(self) -> dict[str, float | None]:
        """The ring row of the whole-tree and count fields."""
        return {
            "tree_rss": self.tree("rss"),
            "tree_uss": self.tree("uss"),
            "tree_anon_swap": self.tree("anon_swap"),
            "gpu_allocated": self.gpu_allocated,
            "gpu_reserved": self.gpu_reserved,
            "kv_cache_usage": self.kv_cache_usage,
            "sessions": self.sessions,
            "engine_unfinished_requests": self.engine_unfinished_requests,
            "turns_in_flight": self.turns_in_flight,
            "asyncio_tasks": self.asyncio_tasks,
            "event_loop_lag_seconds": self.event_loop_lag_seconds,
        }


def proc_status_bytes(pid: int, keys: Iterable[str]) -> dict[str, int]:
    """Fields of /proc/<pid>/status given in kB (Linux), as bytes."""
    wanted, found = set(keys), {}
    with contextlib.suppress(OSError), open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            name, _, rest = line.partition(":")
            if name in wanted:
                found[name] = int(rest.split()[0]) * 1024
    return found


def _role(process: psutil.Process) -> str:
    name = process.name()
    if name.startswith("VLLM::"):  # vLLM titles its processes VLLM::EngineCore, VLLM::Worker...
        return name.removeprefix("VLLM::")
    with contextlib.suppress(psutil.Error):
        if any("resource_tracker" in part for part in process.cmdline()):
            return "resource_tracker"
    return name


def process_tree_memory(root: psutil.Process | None = None) -> tuple[ProcessMemory, ...]:
    """Memory of `root` (default: this process, role "app") and all its descendants.

    Reads /proc: call it from a thread. USS comes from smaps_rollup (where
    readable); RssAnon and VmSwap from /proc/<pid>/status.
    """
    root = root or psutil.Process()
    children: list[psutil.Process] = []
    with contextlib.suppress(psutil.Error):
        children = root.children(recursive=True)
    found: list[ProcessMemory] = []
    seen: dict[str, int] = {}
    for process in [root, *sorted(children, key=lambda p: p.pid)]:
        try:
            role = "app" if process is root else _role(process)
            try:
                info = process.memory_full_info()
                uss: int | None = info.uss
            except psutil.AccessDenied:
                info, uss = process.memory_info(), None
        except psutil.Error:  # it ended while we looked
            continue
        seen[role] = seen.get(role, 0) + 1
        if seen[role] > 1:
            role = f"{role}#{seen[role]}"
        status = proc_status_bytes(process.pid, ("RssAnon", "VmSwap"))
        swap = status.get("VmSwap", getattr(info, "swap", None))
        found.append(ProcessMemory(process.pid, role, info.rss, info.vms, uss, status.get("RssAnon"), swap))
    return tuple(found)


def gpu_memory() -> tuple[int, int] | None:
    """(allocated, reserved) bytes of this process's CUDA caching allocator, if CUDA is in use here.

    vLLM's GPU memory lives in its worker processes; this shows what the app
    process itself holds (it should be ~0).
    """
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    return torch.cuda.memory_allocated(), torch.cuda.memory_reserved()


def kv_cache_usage() -> float | None:
    """The engine's KV-cache usage (0..1) from vLLM's own gauge; None when vLLM exposes none."""
    from prometheus_client import REGISTRY

    values = [
        sample.value
        for family in REGISTRY.restricted_registry([KV_CACHE_GAUGE]).collect()
        for sample in family.samples
        if sample.name == KV_CACHE_GAUGE
    ]
    return max(values) if values else None


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


def theil_sen_slope(times: np.ndarray, values: np.ndarray, max_points: int = LEAK_SLOPE_MAX_POINTS) -> float:
    """Median of pairwise slopes (units per time unit): robust to spikes and single outliers."""
    if len(times) > max_points:
        keep = np.unique(np.linspace(0, len(times) - 1, max_points).round().astype(int))
        times, values = times[keep], values[keep]
    first, second = np.triu_indices(len(times), k=1)
    dt = times[second] - times[first]
    usable = dt > 0
    if not usable.any():
        return math.nan
    return float(np.median((values[second] - values[first])[usable] / dt[usable]))


# --- memory over time and the leak alarm ---------------------------------------
class MemoryMonitor:
    """Memory samples in a preallocated ring, the growth slope after warm-up, and the alarm."""

    def __init__(self, settings: Settings, clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self.started_at = clock()
        self._clock = clock
        columns = [f"p{slot}.{kind}" for slot in range(MAX_TRACKED_PROCESSES) for kind in PROCESS_KINDS]
        self.ring = SampleRing(settings.memory_samples_kept, [*columns, *SAMPLE_FIELDS])
        self.roles: list[str] = []  # slot -> process role; at most MAX_TRACKED_PROCESSES
        self.latest: MemorySample | None = None
        self.slope_mb_per_hour: float | None = None
        self.alarm = False
        self._warned_at: float | None = None

    def _slot(self, role: str) -> int:
        if role in self.roles:
            return self.roles.index(role)
        if len(self.roles) < MAX_TRACKED_PROCESSES - 1:
            self.roles.append(role)
            return len(self.roles) - 1
        if len(self.roles) < MAX_TRACKED_PROCESSES:
            self.roles.append("other")
        return MAX_TRACKED_PROCESSES - 1

    def record(self, sample: MemorySample) -> None:
        """Store a sample, recompute the slope, raise or clear the alarm."""
        row: dict[str, float | None] = dict(sample.values())
        for process in sample.processes:
            slot = self._slot(process.role)
            for kind in PROCESS_KINDS:
                key, value = f"p{slot}.{kind}", getattr(process, kind)
                if value is not None:
                    row[key] = (row.get(key) or 0) + value  # "other" sums what does not fit
        self.ring.append(sample.at, row)
        self.latest = sample
        self.slope_mb_per_hour = self.leak_slope_mb_per_hour(sample.at)
        self._update_alarm(sample.at)

    def leak_slope_mb_per_hour(self, now: float | None = None) -> float | None:
        """Theil-Sen slope of the tree's anon+swap memory over the window after warm-up.

        None until the window holds LEAK_SLOPE_MIN_POINTS samples spanning at
        least half of LEAK_WINDOW_SECONDS.
        """
        now = self._clock() if now is None else now
        s = self.settings
        times = self.ring.times()
        values = self.ring.column("tree_anon_swap")
        since = max(self.started_at + s.leak_warmup_seconds, now - s.leak_window_seconds)
        chosen = (times >= since) & ~np.isnan(values)
        times, values = times[chosen], values[chosen]
        if len(times) < LEAK_SLOPE_MIN_POINTS:
            return None
        if times[-1] - times[0] < LEAK_SLOPE_MIN_WINDOW_SHARE * s.leak_window_seconds:
            return None
        slope = theil_sen_slope(times, values / MB)
        return None if math.isnan(slope) else slope * 3600.0

    def _update_alarm(self, now: float) -> None:
        slope, limit = self.slope_mb_per_hour, self.settings.leak_alarm_mb_per_hour
        alarm = slope is not None and slope > limit
        if alarm:
            due = self._warned_at is None or now - self._warned_at >= LEAK_ALARM_REPEAT_SECONDS
            if due:
                self._warned_at = now
                latest = self.latest
                logger.warning(
                    "memory leak alarm: the process tree grows %.1f MB/hour over the last %.0f min "
                    "(alarm at %.1f MB/hour); anon+swap now %.0f MB",
                    slope,
                    self.settings.leak_window_seconds / 60,
                    limit,
                    (latest.tree("anon_swap") if latest else 0) / MB,
                )
        elif self.alarm:
            self._warned_at = None
            logger.info("memory leak alarm cleared: growth %s MB/hour", _fmt(slope))
        self.alarm = alarm

    def process_series(self, kind: str = "rss") -> dict[str, np.ndarray]:
        """Per-process series of `kind` in bytes, oldest first, keyed by role."""
        return {role: self.ring.column(f"p{slot}.{kind}") for slot, role in enumerate(self.roles)}


def _cancelling_tasks() -> int:
    return sum(1 for task in asyncio.all_tasks() if task.cancelling() and not task.done())


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:+.1f}"


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

    def __init__(self, settings: Settings, sessions: SessionStore, engine: ChatEngine) -> None:
        self.settings = settings
        self.sessions = sessions
        self.engine = engine
        self.memory = MemoryMonitor(settings)
        self.loop_lag = LoopLagMonitor()
        self.rounds = 0
        self.expired_sessions_total = 0
        self.aborted_requests_total = 0
        self.last_round: RoundReport | None = None
        self._process = psutil.Process()
        self._tasks: list[asyncio.Task] = []

    def start(self) -> None:
        """Freeze the start-up heap, then start the three loops in the running event loop (once).

        After imports and engine start-up the app holds millions of long-lived
        objects (torch, transformers, vLLM); a full `gc.collect()` walking them
        blocked the event loop for ~1 s here. Frozen, they are skipped, and a
        round only walks what was allocated while serving (vLLM's EngineCore
        does the same for its own heap).
        """
        if self._tasks:
            return
        gc.collect()
        gc.freeze()
        self._tasks = [
            asyncio.create_task(self._every(self.settings.maintenance_interval_seconds, self.run_round,
                                            first_after=self.settings.maintenance_interval_seconds),
                                name="maintenance-rounds"),
            asyncio.create_task(self._every(self.settings.memory_sample_seconds, self.sample_memory),
                                name="maintenance-memory"),
            asyncio.create_task(self.loop_lag.run(), name="maintenance-loop-lag"),
        ]  # fmt: skip

    async def stop(self) -> None:
        """Cancel the loops and wait for them to end (idempotent)."""
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if tasks:
            gc.unfreeze()

    @property
    def running(self) -> bool:
        return any(not task.done() for task in self._tasks)

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
        )
        self.memory.record(sample)
        return sample
