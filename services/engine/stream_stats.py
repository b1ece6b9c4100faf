"""Timing of one engine request as the app sees it (what metrics, the prefill meter and benchmarks read)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class StreamStats:
    """Timing of one request, filled in while it streams (read by metrics).

    Times are `time.monotonic()` seconds in the app process, except
    `queue_seconds`, which vLLM measures inside the engine core (from QUEUED
    to first SCHEDULED, as reported on `RequestOutput.metrics`).
    """

    request_id: str
    prompt_tokens: int = 0
    output_tokens: int = 0
    submitted_at: float = 0.0
    first_token_at: float | None = None
    last_token_at: float | None = None
    finished_at: float | None = None
    finish_reason: str | None = None  # vLLM's, or "abort", or "repetition" (the loop guard)
    queue_seconds: float | None = None
    cached_tokens: int | None = None  # prompt tokens vLLM found in its prefix cache

    @property
    def ttft_seconds(self) -> float | None:
        return None if self.first_token_at is None else self.first_token_at - self.submitted_at

    @property
    def inter_token_seconds(self) -> float | None:
        """Mean gap between output tokens as the app received them (needs two tokens)."""
        if self.first_token_at is None or self.last_token_at is None or self.output_tokens < 2:
            return None
        return (self.last_token_at - self.first_token_at) / (self.output_tokens - 1)

    @property
    def e2e_seconds(self) -> float | None:
        return None if self.finished_at is None else self.finished_at - self.submitted_at

    def observe(self, output: Any, now: float) -> None:
        """Account one streamed `RequestOutput` (DELTA kind) received at `now`."""
        completion = output.outputs[0]
        self.output_tokens += len(completion.token_ids)
        if completion.token_ids:
            self.last_token_at = now
            if self.first_token_at is None:
                self.first_token_at = now
        if self.queue_seconds is None:
            self.queue_seconds = _queue_seconds(output)
        if self.cached_tokens is None:
            self.cached_tokens = getattr(output, "num_cached_tokens", None)
        if output.finished:
            self.finish_reason = completion.finish_reason or "stop"


def _queue_seconds(output: Any) -> float | None:
    """Engine-side queue time of a request, from vLLM's per-request stats (None when stats are off)."""
    metrics = getattr(output, "metrics", None)
    queued = getattr(metrics, "queued_ts", 0.0)
    scheduled = getattr(metrics, "scheduled_ts", 0.0)
    if not queued or not scheduled:
        return None
    return max(0.0, scheduled - queued)
