"""Warm-up before ready: the engine meets typical prompt lengths and batch sizes once before users do.

vLLM's CPU kernels are prepared the first time a batch shape appears, so the
first request of a new shape is slow (BENCHMARKS.md, warm-up). The service
reports ready (/healthz 200, Chainlit's port open) only after this pass: prompts
of typical lengths one at a time, then short answers in batches of typical
sizes. The batches also measure decode speed per batch size, which admission
takes as its first estimate of how many streams keep a reading pace.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from dataclasses import dataclass, field
from typing import Any

from services.config import Settings
from services.engine.chat_engine import ChatEngine, SamplingSettings

logger = logging.getLogger(__name__)

# A question, a long question or short document, a summary part (capped by the engine's step size).
PROMPT_TOKENS = (48, 320, 1024)
BATCH_SIZES = (1, 2, 4, 8, 16)  # streams decoding together (capped by MAX_NUM_SEQS)
BATCH_ANSWER_TOKENS = 24
WORDS = (
    "apple", "river", "mountain", "cloud", "stone", "garden", "window", "paper", "music", "silver",
    "forest", "candle", "bridge", "ocean", "letter", "market", "winter", "summer", "yellow", "purple",
    "engine", "planet", "rocket", "castle", "dragon", "pencil", "school",
)  # fmt: skip


@dataclass
class WarmUpReport:
    """What the warm-up ran and measured."""

    seconds: float = 0.0
    prompt_ttft_seconds: dict[int, float] = field(default_factory=dict)  # prompt tokens: first token
    decode_seconds_per_token: dict[int, float] = field(default_factory=dict)  # batch size: per stream

    def summary(self) -> dict[str, Any]:
        return {
            "seconds": round(self.seconds, 2),
            "prompt_ttft_seconds": {n: round(s, 3) for n, s in self.prompt_ttft_seconds.items()},
            "decode_seconds_per_token": {n: round(s, 4) for n, s in self.decode_seconds_per_token.items()},
        }


def filler(rng: random.Random, engine: ChatEngine, tokens: int) -> str:
    """A user message of about `tokens` tokens under the chat template, its words drawn at random
    (no two prompts share a prefix, so each is prefilled in full)."""
    words = max(1, tokens - 12) * 3 // 4
    text = " ".join(rng.choice(WORDS) for _ in range(words))
    while len(engine.encode_chat([{"role": "user", "content": text}])) > tokens and len(text) > 8:
        text = text[: int(len(text) * 0.9)]
    return text


async def _timed(
    engine: ChatEngine, text: str, sampling: SamplingSettings, request_id: str
) -> tuple[float, float | None]:
    """(seconds to the first token, seconds per later token) of one request."""
    started = time.monotonic()
    first = last = None
    count = 0
    async for _ in engine.generate([{"role": "user", "content": text}], sampling, request_id):
        last = time.monotonic()
        first = first or last
        count += 1
    ttft = (first or time.monotonic()) - started
    per_token = (last - first) / (count - 1) if first and last and count > 1 else None
    return ttft, per_token


async def warm_up(engine: ChatEngine, settings: Settings) -> WarmUpReport:
    """Run the warm-up pass; return what it measured (logged, and shown in /status).

    Requests are sampled as the service samples by default (TEMPERATURE, TOP_P): vLLM compiles its
    CPU sampler (torch.compile) on the first sampled request.
    """
    started = time.monotonic()
    rng = random.Random(0)
    report = WarmUpReport()
    prompt_sampling = SamplingSettings(settings.temperature, settings.top_p, 2)
    batch_sampling = SamplingSettings(settings.temperature, settings.top_p, BATCH_ANSWER_TOKENS)
    longest = min(settings.max_num_batched_tokens, engine.max_model_len // 2)
    for tokens in sorted({min(t, longest) for t in PROMPT_TOKENS}):
        text = filler(rng, engine, tokens)
        report.prompt_ttft_seconds[tokens], _ = await _timed(
            engine, text, prompt_sampling, f"warm-up-p{tokens}"
        )
    for size in sorted({min(s, settings.max_num_seqs) for s in BATCH_SIZES}):
        texts = [filler(rng, engine, 24) for _ in range(size)]
        results = await asyncio.gather(
            *(_timed(engine, text, batch_sampling, f"warm-up-b{size}-{i}") for i, text in enumerate(texts))
        )
        per_token = [p for _, p in results if p is not None]
        if per_token:
            report.decode_seconds_per_token[size] = sum(per_token) / len(per_token)
    report.seconds = time.monotonic() - started
    logger.info("warm-up took %.1f s: %s", report.seconds, report.summary())
    return report
