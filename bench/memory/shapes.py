"""vLLM worker memory against new batch sizes: oneDNN's primitive cache capped vs its default.

    .venv/bin/python bench/memory/shapes.py                # default model, 300 sizes per arm, ~18 min here
    .venv/bin/python bench/memory/shapes.py --sizes 80     # quick

On CPU, vLLM multiplies matrices with oneDNN, which compiles a kernel
("primitive") for every batch size it meets and keeps them in a global cache
of 1024 by default. The soak's steps have ever-new sizes (prompts and batches
of every length), so that cache is a slow memory ramp. This runs the same
sweep twice, one engine after the other (each starts a fresh worker, which
reads the capacity at start): once with the app's cap
(ENGINE_ONEDNN_CACHE_CAPACITY, services/engine/backends/local/engine.py),
once with oneDNN's default. Each sweep sends prompts with
distinct token counts one at a time, one answer token each, so every prefill
step has a batch size the worker has not seen; each prompt starts with its
own number, so the prefix cache cannot make two steps the same size.

Prints the worker's RSS growth after the warm-up sizes, per arm, and the
ratios of growth and sweep time (capped / default).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any
from unittest import mock

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.common import machine_info, run_until_signalled
from services.config import Settings
from services.engine import ChatEngine, SamplingSettings, engine_lifespan
from services.engine.backends.local import engine as local_engine
from services.observability.memory import process_tree_memory

ONEDNN_DEFAULT_CAPACITY = 1024
PREFILL_ONLY = SamplingSettings(temperature=0.0, top_p=1.0, max_new_tokens=1)


def worker_rss_mb() -> float:
    """RSS of vLLM's worker process (the one that runs the model), in MB."""
    workers = [p for p in process_tree_memory() if "Worker" in p.role]
    assert workers, "no vLLM worker process found"
    return sum(p.rss for p in workers) / 2**20


Chat = list[dict[str, str]]


def distinct_size_prompts(engine: ChatEngine, count: int, first_words: int = 16) -> list[Chat]:
    """`count` chats whose token counts all differ, each opening with its own number."""
    prompts = []
    seen_sizes = set()
    words = first_words
    while len(prompts) < count:
        chat = [{"role": "user", "content": f"{len(prompts):05d} " + "word " * words}]
        size = len(engine.encode_chat(chat))
        if size not in seen_sizes:
            seen_sizes.add(size)
            prompts.append(chat)
        words += 1
    return prompts


async def sweep(engine: ChatEngine, prompts: list[Chat], tag: str) -> None:
    """Prefill each prompt (one answer token), one at a time."""
    for i, chat in enumerate(prompts):
        async for _ in engine.generate(chat, PREFILL_ONLY, f"{tag}-{i}"):
            pass


async def run_arm(settings: Settings, sizes: int, warmup: int, capacity: int) -> dict[str, Any]:
    """One engine whose worker caps oneDNN's cache at `capacity`, one sweep: RSS every 20 sizes,
    growth after the warm-up sizes."""
    with mock.patch.object(local_engine, "ENGINE_ONEDNN_CACHE_CAPACITY", capacity):
        async with engine_lifespan(settings) as engine:
            prompts = distinct_size_prompts(engine, warmup + sizes)
            await sweep(engine, prompts[:warmup], "warm")
            series = [(0, worker_rss_mb())]
            started = time.monotonic()
            for first in range(warmup, warmup + sizes, 20):
                await sweep(engine, prompts[first : first + 20], f"s{first}")
                series.append((min(first + 20, warmup + sizes) - warmup, worker_rss_mb()))
            seconds = time.monotonic() - started
            unfinished = engine.unfinished_requests()
    return {
        "onednn_cache_capacity": capacity,
        "sweep_seconds": round(seconds, 1),
        "worker_rss_after_warmup_mb": round(series[0][1], 1),
        "worker_rss_growth_mb": round(series[-1][1] - series[0][1], 1),
        "series": [(n, round(mb, 1)) for n, mb in series],
        "unfinished_after": unfinished,
    }


async def run(sizes: int, warmup: int) -> dict[str, Any]:
    configured = Settings.from_env()
    capped = await run_arm(configured, sizes, warmup, local_engine.ENGINE_ONEDNN_CACHE_CAPACITY)
    uncapped = await run_arm(configured, sizes, warmup, ONEDNN_DEFAULT_CAPACITY)
    return {
        "machine": machine_info(),
        "model": configured.model_path,
        "new_sizes": sizes,
        "warmup_sizes": warmup,
        "capped": capped,
        "default": uncapped,
        "growth_mb_capped_minus_default": round(
            capped["worker_rss_growth_mb"] - uncapped["worker_rss_growth_mb"], 1
        ),
        "time_ratio_capped_over_default": round(capped["sweep_seconds"] / uncapped["sweep_seconds"], 3),
    }


def report(results: dict[str, Any]) -> str:
    lines = [
        f"{results['new_sizes']} new batch sizes after {results['warmup_sizes']} warm-up sizes, "
        f"model {Path(results['model']).name}",
        "",
        "| oneDNN cache capacity | worker RSS after warm-up (MB) | growth in the sweep (MB) | sweep (s) |",
        "|---:|---:|---:|---:|",
    ]
    for arm in ("capped", "default"):
        r = results[arm]
        lines.append(
            f"| {r['onednn_cache_capacity']} | {r['worker_rss_after_warmup_mb']:.0f} | "
            f"{r['worker_rss_growth_mb']:+.0f} | {r['sweep_seconds']:.1f} |"
        )
    lines += [
        "",
        f"growth, capped minus default: {results['growth_mb_capped_minus_default']:+.0f} MB",
        f"sweep time, capped / default: {results['time_ratio_capped_over_default']:.3f}x",
        f"unfinished engine requests afterwards: {results['capped']['unfinished_after']}, "
        f"{results['default']['unfinished_after']}",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", type=int, default=300, help="new batch sizes per arm (default 300)")
    parser.add_argument("--warmup", type=int, default=40, help="sizes sent before measuring (default 40)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    results = run_until_signalled(run(args.sizes, args.warmup))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))
    print(report(results))


if __name__ == "__main__":
    main()
