"""How fast the engine reads prompts, learned from finished requests, and a ticker for long reads.

vLLM reports nothing about a request until its prefill ends and the first
token comes out; on a CPU a long document takes minutes. `PrefillMeter`
fits seconds = a*n + b*n^2 (attention makes long prompts slower per token)
to the prefills the engine has just done, so the time a prompt of n tokens
needs, and how much of it has been read after t seconds, can be estimated.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable

from services.engine.stream_stats import StreamStats

logger = logging.getLogger(__name__)

MIN_PREFILL_TOKENS = 128  # shorter prefills are dominated by fixed costs
PREFILL_SAMPLES_KEPT = 32


class PrefillMeter:
    """Seconds the engine needs to read n prompt tokens, fitted to recent prefills."""

    def __init__(self, samples_kept: int = PREFILL_SAMPLES_KEPT) -> None:
        self._samples: deque[tuple[int, float]] = deque(maxlen=samples_kept)
        self._fit: tuple[float, float] | None = None

    def observe(self, stats: StreamStats) -> None:
        """Learn from a finished request (an `on_finish` listener of ChatEngine)."""
        computed = stats.prompt_tokens - (stats.cached_tokens or 0)
        ttft = stats.ttft_seconds
        if computed < MIN_PREFILL_TOKENS or ttft is None:
            return
        seconds = ttft - (stats.queue_seconds or 0.0)
        if seconds > 0:
            self._samples.append((computed, seconds))
            self._fit = None

    @property
    def measured(self) -> bool:
        return bool(self._samples)

    def seconds_for(self, tokens: int) -> float | None:
        """Estimated seconds to read `tokens` prompt tokens; None before any measurement."""
        if not self._samples:
            return None
        if self._fit is None:
            self._fit = _fit_quadratic(list(self._samples))
        linear, quadratic = self._fit
        return linear * tokens + quadratic * tokens * tokens

    def tokens_read(self, elapsed_seconds: float, piece_tokens: int, total_tokens: int) -> int | None:
        """Estimated tokens read after `elapsed_seconds` of a job made of prompts of `piece_tokens` each.

        Never the whole total: the job is done only when the engine says so.
        """
        seconds = self.seconds_for(max(piece_tokens, 1))
        if seconds is None:
            return None
        read = elapsed_seconds / max(seconds, 1e-6) * piece_tokens
        return int(min(read, total_tokens * 0.99))


def _fit_quadratic(samples: list[tuple[int, float]]) -> tuple[float, float]:
    """Least squares of seconds = a*n + b*n^2 (no intercept), a and b kept >= 0."""
    s2 = sum(n**2 for n, _ in samples)
    s3 = sum(n**3 for n, _ in samples)
    s4 = sum(n**4 for n, _ in samples)
    t1 = sum(t * n for n, t in samples)
    t2 = sum(t * n**2 for n, t in samples)
    determinant = s2 * s4 - s3 * s3
    if determinant > 1e-9 * s2 * s4:
        a = (t1 * s4 - t2 * s3) / determinant
        b = (s2 * t2 - s3 * t1) / determinant
        if a >= 0 and b >= 0:
            return a, b
    return t1 / s2, 0.0  # one size seen, or a fit that bends the wrong way: linear


async def tick_until_first(
    stream: AsyncIterator[str], tick: Callable[[], Awaitable[None]], interval_seconds: float
) -> AsyncIterator[str]:
    """Pass `stream` through; until its first item arrives, await `tick()` every `interval_seconds`.

    The ticker is a task of its own, so the stream is consumed in the caller's task only.
    """

    async def ticking() -> None:
        while True:
            await asyncio.sleep(interval_seconds)
            try:
                await tick()
            except Exception:  # progress is a courtesy: it never breaks the answer
                logger.warning("a progress report failed", exc_info=True)

    ticker: asyncio.Task | None = asyncio.create_task(ticking(), name="reading-progress")
    try:
        async with contextlib.aclosing(stream):  # type: ignore[type-var]  (an async generator)
            async for item in stream:
                if ticker is not None:
                    ticker = await _stopped(ticker)
                yield item
    finally:
        if ticker is not None:
            await _stopped(ticker)


async def _stopped(task: asyncio.Task) -> None:
    """Cancel the ticker and wait for it (a cancellation of the caller still propagates)."""
    task.cancel()
    await asyncio.wait([task])
