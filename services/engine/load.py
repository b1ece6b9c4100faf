"""The engine's own numbers over time: requests running and waiting, tokens generated and prefilled.

In process, vLLM hands every engine iteration's `SchedulerStats` and
`IterationStats` to the stat loggers given to `AsyncLLM(stat_loggers=...)`;
`load_stat_logger` is such a logger. With ENGINE_URLS the same numbers come
from each server's Prometheus /metrics (see remote.py). `EngineLoad` folds
them into windows of about a second, kept in a fixed-size ring, which the
admission controller reads to learn how fast the engine decodes at each
batch size.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Any

WINDOW_SECONDS = 1.0
WINDOWS_KEPT = 600  # ten minutes of busy engine time


@dataclass(frozen=True)
class LoadWindow:
    """About a second of engine work: how many requests ran, and what they produced."""

    ended_at: float  # monotonic
    seconds: float  # wall time covered
    busy_seconds: float  # of which at least one request was running
    running: float  # time-weighted mean of running requests over the busy time
    waiting: float  # time-weighted mean of requests waiting inside the engine
    generation_tokens: int
    prompt_tokens: int

    @property
    def seconds_per_token(self) -> float | None:
        """Seconds each running request waited per generated token (None when nothing ran)."""
        if self.busy_seconds <= 0 or self.running <= 0:
            return None
        per_request = self.generation_tokens / self.running
        return self.busy_seconds / per_request if per_request > 0 else self.busy_seconds


class EngineLoad:
    """Latest running/waiting counts and a ring of recent windows, fed once per engine iteration."""

    def __init__(self, window_seconds: float = WINDOW_SECONDS, windows_kept: int = WINDOWS_KEPT) -> None:
        self.window_seconds = window_seconds
        self.windows: deque[LoadWindow] = deque(maxlen=windows_kept)
        self.running = 0
        self.waiting = 0
        self.updated_at: float | None = None
        # Requests at the engine that are not this process's (other app replicas, other clients of
        # the same vLLM servers or router), at `foreign_at`; only remote engines have any.
        self.foreign = 0
        self.foreign_at: float | None = None
        self.generation_tokens_total = 0
        self.prompt_tokens_total = 0
        self._start: float | None = None
        self._sums = [0.0, 0.0, 0.0, 0, 0]  # busy seconds, running*s, waiting*s, gen tokens, prompt tokens

    def record(
        self, now: float, running: int, waiting: int, generation_tokens: int, prompt_tokens: int
    ) -> None:
        """One engine iteration at `now`: counts after it, tokens it produced and prefilled."""
        previous = self.updated_at
        if previous is not None and self.running > 0:  # time since the last iteration was busy
            elapsed = max(0.0, now - previous)
            self._sums[0] += elapsed
            self._sums[1] += self.running * elapsed
            self._sums[2] += self.waiting * elapsed
        if self._start is None or (self.running == 0 and self._sums[0] == 0):
            self._start = now  # an idle engine starts no window
        self._sums[3] += generation_tokens
        self._sums[4] += prompt_tokens
        self.generation_tokens_total += generation_tokens
        self.prompt_tokens_total += prompt_tokens
        self.running = running
        self.waiting = waiting
        self.updated_at = now
        if now - self._start >= self.window_seconds:
            self._close_window(now)

    def _close_window(self, now: float) -> None:
        busy, running_s, waiting_s, generated, prompted = self._sums
        if busy > 0:
            mean_running, mean_waiting = running_s / busy, waiting_s / busy
            seconds = now - (now if self._start is None else self._start)
            window = LoadWindow(now, seconds, busy, mean_running, mean_waiting, int(generated), int(prompted))
            self.windows.append(window)
        self._start = now
        self._sums = [0.0, 0.0, 0.0, 0, 0]

    def note_foreign(self, now: float, engine_total: int, ours: int) -> None:
        """The engine held `engine_total` requests (running and waiting) when `ours` were this process's."""
        self.foreign = max(0, engine_total - ours)
        self.foreign_at = now

    def foreign_requests(self, now: float, max_age: float) -> int:
        """Others' requests at the engine, as last read, if read within `max_age` seconds; else 0."""
        fresh = self.foreign_at is not None and now - self.foreign_at <= max_age
        return self.foreign if fresh else 0

    def windows_after(self, moment: float) -> list[LoadWindow]:
        """Windows that ended after `moment` (monotonic), oldest first."""
        return [w for w in self.windows if w.ended_at > moment]

    def generation_rate(self, seconds: float, now: float | None = None) -> float:
        """Tokens generated per second over the last `seconds` of windows (0 when idle)."""
        now = time.monotonic() if now is None else now
        recent = [w for w in self.windows if w.ended_at > now - seconds]
        covered = sum(w.seconds for w in recent)
        return sum(w.generation_tokens for w in recent) / covered if covered > 0 else 0.0


def load_stat_logger(load: EngineLoad) -> Any:
    """A vLLM stat logger class (its factory) that feeds `load` with every engine iteration."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class LoadStatLogger(StatLoggerBase):
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            self.engine_index = engine_index

        def record(
            self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None, engine_idx: int = 0
        ) -> None:
            running = getattr(scheduler_stats, "num_running_reqs", load.running)
            waiting = getattr(scheduler_stats, "num_waiting_reqs", load.waiting)
            generated = getattr(iteration_stats, "num_generation_tokens", 0)
            prompted = getattr(iteration_stats, "num_prompt_tokens", 0)
            load.record(time.monotonic(), running, waiting, generated, prompted)

        def log_engine_initialized(self) -> None:
            pass

    return LoadStatLogger
