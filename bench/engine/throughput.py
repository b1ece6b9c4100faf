"""Engine benchmark on the default model: startup, tokens/s for 1 and 8 streams, memory over 200 requests.

    .venv/bin/python bench/engine/throughput.py           # ~4 min on 2 cores
    .venv/bin/python bench/engine/throughput.py --quick   # fewer requests

In-process, through ChatEngine (the code the app runs). Memory is the RSS of
this process (the app's role) and of each vLLM child process (EngineCore and
worker), after start and after 200 requests of varied lengths, a quarter of
them aborted mid-stream (the variable-length / abandoned-request pattern of
the leak report).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import random
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.common import run_until_signalled
from services.config import Settings
from services.engine import ChatEngine, SamplingSettings, StreamStats, engine_lifespan

PROMPT = [{"role": "user", "content": "Write a long, detailed story about a lighthouse keeper."}]
GREEDY_LONG = SamplingSettings(temperature=0.0, top_p=1.0, max_new_tokens=256)


def tree_rss_mb() -> dict[str, float]:
    """RSS in MB of this process and each child, by a readable name."""
    me = psutil.Process()
    sizes = {"app (main)": me.memory_info().rss / 2**20}
    for child in me.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            name = " ".join(child.cmdline()[-1:])[:40] or child.name()
            sizes[f"{child.name()} {child.pid} {name}"] = child.memory_info().rss / 2**20
    sizes["total"] = sum(sizes.values())
    return sizes


async def stream_tokens(engine: ChatEngine, request_id: str, sampling: SamplingSettings) -> None:
    async for _ in engine.generate(PROMPT, sampling, request_id):
        pass


async def tokens_per_second(
    engine: ChatEngine, streams: int, rounds: int, finished: list[StreamStats]
) -> float:
    """Aggregate output tokens per second with `streams` concurrent requests."""
    finished.clear()
    started = time.monotonic()
    for r in range(rounds):
        await asyncio.gather(
            *(stream_tokens(engine, f"tps-{streams}-{r}-{i}", GREEDY_LONG) for i in range(streams))
        )
    elapsed = time.monotonic() - started
    return sum(s.output_tokens for s in finished) / elapsed


async def churn(engine: ChatEngine, requests: int, seed: int = 7) -> None:
    """`requests` requests of random lengths, 8 at a time, a quarter abandoned mid-stream."""
    rng = random.Random(seed)
    limit = asyncio.Semaphore(8)

    async def one(i: int) -> None:
        sampling = SamplingSettings(0.8, 0.95, rng.randint(8, 160))
        words = " ".join(["context"] * rng.randint(5, 1500))
        messages = [{"role": "user", "content": f"{words}\nSummarize request {i}."}]
        async with limit:
            stream = engine.generate(messages, sampling, f"churn-{i}")
            async with contextlib.aclosing(stream):
                async for n, _ in aenumerate(stream):
                    if i % 4 == 0 and n == 3:
                        break

    await asyncio.gather(*(one(i) for i in range(requests)))


async def aenumerate(stream):
    n = 0
    async for item in stream:
        yield n, item
        n += 1


async def run(quick: bool) -> dict:
    started = time.monotonic()
    async with engine_lifespan(Settings.from_env({})) as engine:
        startup_seconds = time.monotonic() - started
        finished: list[StreamStats] = []
        engine.on_finish(finished.append)
        after_start = tree_rss_mb()
        rounds = 1 if quick else 3
        single = await tokens_per_second(engine, 1, rounds, finished)
        eight = await tokens_per_second(engine, 8, rounds, finished)
        await churn(engine, 40 if quick else 200)
        gc.collect()
        await asyncio.sleep(1)
        after_churn = tree_rss_mb()
        unfinished = engine.unfinished_requests()
    return {
        "startup_seconds": startup_seconds,
        "tokens_per_second_1": single,
        "tokens_per_second_8": eight,
        "rss_after_start_mb": after_start,
        "rss_after_requests_mb": after_churn,
        "unfinished_after": unfinished,
        "requests": 40 if quick else 200,
    }


def report(results: dict) -> str:
    lines = [
        f"engine startup (incl. warm-up): {results['startup_seconds']:.1f} s",
        f"tokens/s, 1 stream: {results['tokens_per_second_1']:.1f}",
        f"tokens/s, 8 streams (aggregate): {results['tokens_per_second_8']:.1f} "
        f"({results['tokens_per_second_8'] / results['tokens_per_second_1']:.1f}x)",
        f"unfinished engine requests after {results['requests']} requests: {results['unfinished_after']}",
        "",
        f"| process | RSS after start (MB) | RSS after {results['requests']} requests (MB) |",
        "|---|---|---|",
    ]
    before, after = results["rss_after_start_mb"], results["rss_after_requests_mb"]
    for name in before:
        lines.append(f"| {name} | {before[name]:.0f} | {after.get(name, float('nan')):.0f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    print(report(run_until_signalled(run(args.quick))))


if __name__ == "__main__":
    main()
