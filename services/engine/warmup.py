"""Warm-up before ready: the engine meets typical prompt lengths and batch sizes once before users do.

vLLM's CPU kernels are prepared the first time a batch shape appears, so the
first request of a new shape is slow (BENCHMARKS.md, warm-up). The service
reports ready (/healthz 200, Chainlit's port open) only after this pass: prompts
of typical lengths one at a time, then short answers in batches of doubling
size, up to the first batch too slow for the reading pace. The batches measure
decode speed per batch size, which admission takes as its first estimate of how
many streams keep that pace; and they leave the worker's per-shape kernel caches
as full as admission's largest batches would, before the first peak of users.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from dataclasses import dataclass, field
from typing import Any

from services.config import Settings
from services.engine.chat_engine import ChatEngine, SamplingSettings

logger = logging.getLogger(__name__)

# A question, a long question or short document, a summary part (capped by the engine's step size).
PROMPT_TOKENS = (48, 320, 1024)
# Streams decoding together (capped by MAX_NUM_SEQS), up to the first size too slow for the reading
# pace (admission runs no more): vLLM keeps 32 oneDNN matmul primitives per layer shape, those of
# larger batches bigger, and a first peak of streams would otherwise grow the worker for good
# (BENCHMARKS.md, bursts).
BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64)
# The running limit is planned for this multiple of READING_PACE_TOKENS_PER_SECOND: the decode-speed
# model leaves out the prefills of newly admitted turns and document parts, which slow every stream
# while they run (1 would plan for the pace exactly, and the slowest streams fall under it).
READING_PACE_HEADROOM = 1.25
BATCH_ANSWER_TOKENS = 32  # the first few overlap the others' prefill; the rest measure decoding
KERNEL_FILL_ANSWER_TOKENS = 3  # with known speeds: the first token from the prefill, two decode steps
WORDS = (
    "apple",
    "river",
    "mountain",
    "cloud",
    "stone",
    "garden",
    "window",
    "paper",
    "music",
    "silver",
    "forest",
    "candle",
    "bridge",
    "ocean",
    "letter",
    "market",
    "winter",
    "summer",
    "yellow",
    "purple",
    "engine",
    "planet",
    "rocket",
    "castle",
    "dragon",
    "pencil",
    "school",
)


@dataclass
class WarmUpReport:
    """What the warm-up ran and measured."""

    seconds: float = 0.0
    prompt_ttft_seconds: dict[int, float] = field(default_factory=dict)  # prompt tokens: first token
    decode_seconds_per_token: dict[int, float] = field(default_factory=dict)  # batch size: per stream
    decode_age_seconds: float = 0.0  # how old the decode speeds are: > 0 when taken from a record

    def summary(self) -> dict[str, Any]:
        return {
            "seconds": round(self.seconds, 2),
            "prompt_ttft_seconds": {n: round(s, 3) for n, s in self.prompt_ttft_seconds.items()},
            "decode_seconds_per_token": {n: round(s, 4) for n, s in self.decode_seconds_per_token.items()},
            "decode_age_seconds": round(self.decode_age_seconds),
        }


def filler(rng: random.Random, engine: ChatEngine, tokens: int) -> str:
    """A user message of about `tokens` tokens under the chat template, its words drawn at random
    (no two prompts share a prefix, so each is prefilled in full)."""
    words = max(1, tokens - 12) * 3 // 4
    text = " ".join(rng.choice(WORDS) for _ in range(words))
    while len(engine.encode_chat([{"role": "user", "content": text}])) > tokens and len(text) > 8:
        text = text[: int(len(text) * 0.9)]
    return text


async def _token_times(
    engine: ChatEngine, text: str, sampling: SamplingSettings, request_id: str
) -> list[float]:
    """When each piece of one request's answer arrived (monotonic), starting with the send time."""
    times = [time.monotonic()]
    async for _ in engine.generate([{"role": "user", "content": text}], sampling, request_id):
        times.append(time.monotonic())
    return times


def decode_seconds_per_token(batch: list[list[float]]) -> float | None:
    """Seconds per token per stream while every request of the batch was decoding (after the last
    first token), so that the prefill of the others does not count."""
    all_decoding = max(times[1] for times in batch if len(times) > 1)
    gaps = []
    for times in batch:
        later = [t for t in times[1:] if t > all_decoding]
        if len(later) >= 2:
            gaps.append((later[-1] - later[0]) / (len(later) - 1))
    return sum(gaps) / len(gaps) if gaps else None


async def _decode_batch(engine: ChatEngine, texts: list[str], sampling: SamplingSettings) -> float | None:
    """Answer `texts` at once; seconds per token per stream while all of them decoded."""
    batch = await asyncio.gather(
        *(_token_times(engine, text, sampling, f"warm-up-b{len(texts)}-{i}") for i, text in enumerate(texts))
    )
    return decode_seconds_per_token(batch) if any(len(times) > 1 for times in batch) else None


async def warm_up(
    engine: ChatEngine,
    settings: Settings,
    report: WarmUpReport | None = None,
    known: tuple[dict[int, float], float] | None = None,
) -> WarmUpReport:
    """Run the warm-up pass; return what it measured into `report` (logged, and shown in /status).

    Requests are sampled as the service samples by default (TEMPERATURE, TOP_P): vLLM compiles its
    CPU sampler (torch.compile) on the first sampled request. `known` is decode speeds measured by
    an earlier start and their age (warmup_record.py): each of its batch sizes then runs with
    answers just long enough to decode at that size, and nothing is measured.
    """
    started = time.monotonic()
    rng = random.Random(0)
    report = report if report is not None else WarmUpReport()
    prompt_sampling = SamplingSettings(settings.temperature, settings.top_p, 2)
    batch_sampling = SamplingSettings(settings.temperature, settings.top_p, BATCH_ANSWER_TOKENS)
    longest = min(settings.max_num_batched_tokens, engine.max_model_len // 2)
    for tokens in sorted({min(t, longest) for t in PROMPT_TOKENS}):
        times = await _token_times(engine, filler(rng, engine, tokens), prompt_sampling, f"warm-up-p{tokens}")
        report.prompt_ttft_seconds[tokens] = (times[1] if len(times) > 1 else time.monotonic()) - times[0]
    pace = settings.reading_pace_tokens_per_second * READING_PACE_HEADROOM
    slowest = 1 / pace if pace > 0 else math.inf  # no pace: admission may run MAX_NUM_SEQS at once
    if known is not None:
        speeds, report.decode_age_seconds = known
        fill = SamplingSettings(settings.temperature, settings.top_p, KERNEL_FILL_ANSWER_TOKENS)
        for size in sorted(speeds):
            await _decode_batch(engine, [filler(rng, engine, 24) for _ in range(size)], fill)
        report.decode_seconds_per_token = dict(speeds)
        return _finish(report, started)
    for size in sorted({min(s, settings.max_num_seqs) for s in BATCH_SIZES}):
        per_token = await _decode_batch(
            engine, [filler(rng, engine, 24) for _ in range(size)], batch_sampling
        )
        if per_token is not None:
            report.decode_seconds_per_token[size] = per_token
            if per_token > slowest:  # admission will not run this many at once: no larger batches
                break
    return _finish(report, started)


def _finish(report: WarmUpReport, started: float) -> WarmUpReport:
    report.seconds = time.monotonic() - started
    logger.info("warm-up took %.1f s: %s", report.seconds, report.summary())
    return report
