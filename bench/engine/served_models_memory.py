"""What each in-process model costs (MODELS): start time and whole-tree memory with 1..N tiny models.

Builds N tiny random-weight models (harness/tiny_model.py, seeds 0..N-1), starts them side by side
as the app does (`served_models_lifespan`), answers one prompt from each, and sums the resident memory
of this process and every child (EngineCore and worker per model). The answer to "how many models
may one machine hold": MAX_IN_PROCESS_MODELS.

    .venv/bin/python bench/engine/served_models_memory.py --models 2 --save-results
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.common import OUT, result_path
from harness.tiny_model import build_tiny_model
from services.config import Settings
from services.engine import SamplingSettings, served_models_lifespan
from services.engine.backends.local import ensure_default_model


def tree_rss_mb() -> float:
    me = psutil.Process()
    total = 0
    for process in [me, *me.children(recursive=True)]:
        try:
            total += process.memory_info().rss
        except psutil.NoSuchProcess:
            continue
    return total / 2**20


async def measure(count: int, folder: Path) -> dict:
    tokenizer = ensure_default_model(Settings.from_env({}))
    paths = [build_tiny_model(tokenizer, folder / f"tiny-{seed}", seed=seed) for seed in range(count)]
    settings = Settings.from_env({}).replace(
        models=",".join(map(str, paths)),
        max_in_process_models=count,
        max_model_len=4096,
        max_num_batched_tokens=4096,
    )
    before = tree_rss_mb()
    started = time.monotonic()
    async with served_models_lifespan(settings) as models:
        start_seconds = time.monotonic() - started
        answers = {}
        for name, engine in models:
            parts = []
            messages = [{"role": "user", "content": "Hello"}]
            async for delta in engine.generate(messages, SamplingSettings(0.0, 1.0, 8), f"bench-{name}"):
                parts.append(delta)
            answers[name] = "".join(parts)
        tree = tree_rss_mb()
        processes = len(psutil.Process().children(recursive=True))
    return {
        "models": count,
        "start_seconds": round(start_seconds, 1),
        "rss_before_mb": round(before),
        "tree_rss_mb": round(tree),
        "engine_processes": processes,
        "answers": answers,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", type=int, default=2, help="measure 1..N models (default 2)")
    parser.add_argument(
        "--save-results", action="store_true", help="copy the summary to bench/results/engine/"
    )
    args = parser.parse_args()
    folder = OUT / "served-models"
    folder.mkdir(parents=True, exist_ok=True)
    runs = [asyncio.run(measure(count, folder)) for count in range(1, args.models + 1)]
    summary = {"runs": runs, "machine_memory_gb": round(psutil.virtual_memory().total / 2**30, 1)}
    text = json.dumps(summary, indent=2)
    print(text)
    (folder / "summary.json").write_text(text)
    if args.save_results:
        path = result_path("engine", "served-models-memory")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"saved {path}")


if __name__ == "__main__":
    main()
