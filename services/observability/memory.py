"""Memory of the app and every engine process, sampled into a ring; the growth slope and the leak alarm."""

from __future__ import annotations

import contextlib
import logging
import math
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
import numpy.ma  # np.median/np.unique import it on first use: not mid-serving
import psutil

from services.config import Settings
from services.engine.backends.local import process_role
from services.observability.series import SampleRing, theil_sen_slope

logger = logging.getLogger(__name__)

MB = 1024 * 1024
# Process slots in the memory ring: app, EngineCore, workers, helpers; the rest share "other".
MAX_TRACKED_PROCESSES = 8
PROCESS_KINDS = ("rss", "vms", "uss", "anon", "swap")
# A slope needs this many samples covering at least half the window, or one bump looks like a trend.
LEAK_SLOPE_MIN_POINTS = 10
LEAK_SLOPE_MIN_WINDOW_SHARE = 0.5
LEAK_ALARM_REPEAT_SECONDS = 600.0  # while the alarm stays on, warn again this often
MEMORY_SAMPLES_KEPT = 4320  # memory samples in the ring: 6 h at MEMORY_SAMPLE_SECONDS' 5 s, for /stats
LEAK_WARMUP_SECONDS = 300.0  # start-up left out of the leak slope: memory filling then is not a leak
LEAK_WINDOW_SECONDS = 3600.0  # sliding window of the leak slope (the alarm is in MB per hour)
KV_CACHE_GAUGE = "vllm:kv_cache_usage_perc"
SAMPLE_FIELDS = (
    "tree_rss",
    "tree_uss",
    "tree_anon_swap",
    "gpu_allocated",
    "gpu_reserved",
    "kv_cache_usage",
    "sessions",
    "engine_unfinished_requests",
    "turns_in_flight",
    "asyncio_tasks",
    "event_loop_lag_seconds",
    "requests_total",
)
# Bytes per request needs this many requests served within the window, or idle noise looks like retention.
RETENTION_MIN_REQUESTS = 200


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
    requests_total: int = 0  # chat requests the engine has finished since start

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
            "requests_total": self.requests_total,
        }


def proc_status_bytes(pid: int, keys: Iterable[str]) -> dict[str, int]:
    """Fields of /proc/<pid>/status given in kB (Linux), as bytes."""
    wanted = set(keys)
    found = {}
    with contextlib.suppress(OSError), open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            name, _, rest = line.partition(":")
            if name in wanted:
                found[name] = int(rest.split()[0]) * 1024
    return found


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
            role = "app" if process is root else process_role(process)
            try:
                info = process.memory_full_info()
                uss: int | None = info.uss
            except psutil.AccessDenied:
                info = process.memory_info()
                uss = None
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


# --- memory over time and the leak alarm ---------------------------------------
class MemoryMonitor:
    """Memory samples in a preallocated ring, the growth slope after warm-up, and the alarm."""

    def __init__(
        self,
        settings: Settings,
        clock: Callable[[], float] = time.monotonic,
        *,
        samples_kept: int = MEMORY_SAMPLES_KEPT,
        warmup_seconds: float = LEAK_WARMUP_SECONDS,
        window_seconds: float = LEAK_WINDOW_SECONDS,
    ) -> None:
        """`samples_kept`: the ring's rows; `warmup_seconds` and `window_seconds`: the leak slope's."""
        self.settings = settings
        self.started_at = clock()
        self._clock = clock
        self.warmup_seconds, self.window_seconds = warmup_seconds, window_seconds
        columns = [f"p{slot}.{kind}" for slot in range(MAX_TRACKED_PROCESSES) for kind in PROCESS_KINDS]
        self.ring = SampleRing(samples_kept, [*columns, *SAMPLE_FIELDS])
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
                key = f"p{slot}.{kind}"
                value = getattr(process, kind)
                if value is not None:
                    row[key] = (row.get(key) or 0) + value  # "other" sums what does not fit
        self.ring.append(sample.at, row)
        self.latest = sample
        self.slope_mb_per_hour = self.leak_slope_mb_per_hour(sample.at)
        self._update_alarm(sample.at)

    def _window(self, now: float | None) -> np.ndarray:
        """Mask of the ring rows inside the leak window: after warm-up, within LEAK_WINDOW_SECONDS."""
        now = self._clock() if now is None else now
        since = max(self.started_at + self.warmup_seconds, now - self.window_seconds)
        return self.ring.times() >= since

    def _enough(self, times: np.ndarray) -> bool:
        return len(times) >= LEAK_SLOPE_MIN_POINTS and (
            times[-1] - times[0] >= LEAK_SLOPE_MIN_WINDOW_SHARE * self.window_seconds
        )

    def leak_slope_mb_per_hour(self, now: float | None = None) -> float | None:
        """Theil-Sen slope of the tree's anon+swap memory over the window after warm-up.

        None until the window holds LEAK_SLOPE_MIN_POINTS samples spanning at
        least half of LEAK_WINDOW_SECONDS.
        """
        values = self.ring.column("tree_anon_swap")
        chosen = self._window(now) & ~np.isnan(values)
        times, values = self.ring.times()[chosen], values[chosen]
        if not self._enough(times):
            return None
        slope = theil_sen_slope(times, values / MB)
        return None if math.isnan(slope) else slope * 3600.0

    def process_growth(self, now: float | None = None) -> dict[str, dict[str, float | None]]:
        """Per process, over the leak window: anon+swap growth in MB/hour and in bytes per request served.

        Bytes per request is the slope against the engine's finished-request count, so
        it reads the same at any load; None until RETENTION_MIN_REQUESTS were served.
        """
        chosen = self._window(now)
        times, served = self.ring.times()[chosen], self.ring.column("requests_total")[chosen]
        growth: dict[str, dict[str, float | None]] = {}
        for slot, role in enumerate(self.roles):
            values = self._anon_swap(slot)[chosen]
            known = ~np.isnan(values)
            per_hour = per_request = None
            if self._enough(times[known]):
                per_hour = _finite(theil_sen_slope(times[known], values[known] / MB) * 3600.0)
                counted = known & ~np.isnan(served)
                if counted.any() and np.ptp(served[counted]) >= RETENTION_MIN_REQUESTS:
                    per_request = _finite(theil_sen_slope(served[counted], values[counted]))
            growth[role] = {"mb_per_hour": per_hour, "bytes_per_request": per_request}
        return growth

    def _anon_swap(self, slot: int) -> np.ndarray:
        """anon + swap of one slot (RSS where anon is unknown), as ProcessMemory.anon_swap."""
        anon, rss = self.ring.column(f"p{slot}.anon"), self.ring.column(f"p{slot}.rss")
        return np.where(np.isnan(anon), rss, anon) + np.nan_to_num(self.ring.column(f"p{slot}.swap"))

    def _update_alarm(self, now: float) -> None:
        slope = self.slope_mb_per_hour
        limit = self.settings.leak_alarm_mb_per_hour
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
                    self.window_seconds / 60,
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


def _finite(value: float) -> float | None:
    return None if math.isnan(value) else value


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:+.1f}"
