"""What bounding the tokenizer's word cache costs: speed and memory, side by side in one run.

    .venv/bin/python bench/memory/native_caches.py                   # ~1 minute
    .venv/bin/python bench/memory/native_caches.py --save-results    # JSON under bench/results/memory/

The app bounds the BPE word cache at TOKENIZER_WORD_CACHE words (services/memory/word_caches.py;
tokenizers' own default is 10,000). Three copies of the default model's tokenizer
(10,000 words, the app's bound, no cache) encode the real documents of
bench/data/summary_documents.json, the arms interleaved round by round. Reported
per arm: the median time per round, its ratio to tokenizers' default, and the glibc
heap the arm's cache took in its first round and in the rounds after (documents
already seen add no words). Also timed: filling numpy's small-buffer cache.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.common import machine_info, result_path
from bench.documents.corpus import load_documents
from services.config import Settings
from services.documents.encoding import decode_text
from services.engine.backends.local import ensure_default_model
from services.memory import TOKENIZER_WORD_CACHE, bound_tokenizer_word_cache, fill_numpy_buffer_cache
from services.observability.maintenance import malloc_info

TOKENIZERS_DEFAULT_WORDS = 10_000


def _in_use() -> int:
    info = malloc_info()
    return info["in_use_bytes"] if info else 0


def measure(rounds: int, settings: Settings) -> dict:
    from transformers import AutoTokenizer

    documents, skipped = load_documents(None)
    texts = [decode_text(entry["data"], []) for entry in documents]
    folder = ensure_default_model(settings)
    arms = {f"{words} words": words for words in (TOKENIZERS_DEFAULT_WORDS, TOKENIZER_WORD_CACHE, 0)}
    tokenizers = {name: AutoTokenizer.from_pretrained(folder) for name in arms}
    for name, words in arms.items():
        bound_tokenizer_word_cache(tokenizers[name], words)
        tokenizers[name].encode("first use")  # lazy set-up, outside the measured rounds
    seconds: dict[str, list[float]] = {name: [] for name in arms}
    heap: dict[str, list[int]] = {name: [] for name in arms}
    tokens = 0
    for _ in range(rounds):
        for name, tokenizer in tokenizers.items():
            before = _in_use()
            started = time.perf_counter()
            tokens = sum(len(tokenizer.encode(text, add_special_tokens=False)) for text in texts)
            seconds[name].append(time.perf_counter() - started)
            heap[name].append(_in_use() - before)
    default = statistics.median(seconds[f"{TOKENIZERS_DEFAULT_WORDS} words"])
    started = time.perf_counter()
    numpy_bytes = fill_numpy_buffer_cache()
    return {
        "documents": len(texts),
        "skipped": [entry["id"] for entry in skipped],
        "tokens_per_round": tokens,
        "rounds": rounds,
        "tokenizer": {
            name: {
                "median_round_s": round(statistics.median(seconds[name]), 4),
                "time_ratio_to_10000_words": round(statistics.median(seconds[name]) / default, 3),
                "heap_first_round_mb": round(heap[name][0] / 1e6, 3),
                "heap_later_rounds_mb": round(sum(heap[name][1:]) / 1e6, 3),
            }
            for name in arms
        },
        "numpy_buffer_cache": {
            "filled_mb": round(numpy_bytes / 1e6, 2),
            "fill_ms": round((time.perf_counter() - started) * 1000, 1),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=7, help="passes over the documents per arm")
    parser.add_argument("--save-results", action="store_true", help="write the JSON to bench/results/memory/")
    args = parser.parse_args()
    settings = Settings.from_env()
    summary = {
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine_info(),
        **measure(args.rounds, settings),
    }
    text = json.dumps(summary, indent=1)
    print(text)
    if args.save_results:
        path = result_path("memory", "native-caches", at=datetime.now(UTC))
        path.write_text(text + "\n")
        print(f"saved {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
