"""Document benchmark on the default model: summary latency, concurrent vs sequential map, prefix cache.

    .venv/bin/python bench/documents/summary_latency.py            # ~24 min on 2 AVX2 cores in float32
    .venv/bin/python bench/documents/summary_latency.py --quick    # smaller documents, ~13 min

Everything runs through the real session layer and engine (in-process, the
same code the app runs), in one process, side by side:
  1. a ~4,000-word document: time to the first summary token and total time;
  2. a document ~4x the context: map-reduce with the map requests submitted
     together (SUMMARY_CONCURRENCY=8) vs one at a time (=1); two documents of
     the same length and style so the prefix cache cannot favour the second run;
  3. a follow-up question on document 1: its time to first token vs the first
     request's (the document's KV is reused from the prefix cache).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.common import run_until_signalled
from harness.documents import long_document
from services.chat.service import ChatService
from services.chat.session import ChatSession
from services.chat.store import SessionStore
from services.config import Settings
from services.documents.progress import SummaryProgress
from services.engine import ChatEngine, engine_lifespan

TARGET_MAP_RATIO = 0.5  # concurrent map-reduce time / sequential, at most
TARGET_FOLLOW_UP_RATIO = 0.2  # follow-up TTFT / first request TTFT, at most


@dataclass
class Timing:
    ttft_seconds: float
    total_seconds: float
    parts: int = 1


async def timed(stream) -> Timing:
    started = time.monotonic()
    first = None
    async for _ in stream:
        if first is None:
            first = time.monotonic() - started
    return Timing(first or 0.0, time.monotonic() - started)


async def attach(chat: ChatService, session: ChatSession, name: str, text: str) -> None:
    folder = Path(tempfile.mkdtemp(prefix="bench-doc-"))
    path = folder / name
    path.write_text(text)
    result = await chat.attach_files(session, [(str(path), name)])
    folder.rmdir()
    assert result.document is not None, result.errors


async def summarize(store: SessionStore, chat: ChatService, session_id: str, text: str, label: str) -> Timing:
    session = store.open(session_id)
    await attach(chat, session, f"{label}.txt", text)
    parts = 0

    async def progress(update: SummaryProgress) -> None:
        nonlocal parts
        parts = update.parts_total

    async with store.turn(session) as request_id:
        timing = await timed(chat.summarize(session, "", request_id, progress))
    timing.parts = max(parts, 1)
    return timing


async def follow_up(store: SessionStore, chat: ChatService, session_id: str, question: str) -> Timing:
    session = store.open(session_id)
    async with store.turn(session) as request_id:
        prompt = chat.build_prompt(session, question)
        return await timed(chat.reply(session, prompt, request_id))


async def run(quick: bool) -> dict:
    settings = Settings.from_env({})
    words = 1500 if quick else 4000
    context_multiple = 2 if quick else 4
    async with engine_lifespan(settings) as engine:
        engine: ChatEngine
        results: dict = {"model": settings.model_path, "max_model_len": engine.max_model_len}
        store = SessionStore(settings)
        chat = ChatService(engine, settings)

        doc = long_document(words, seed=101)
        first = await summarize(store, chat, "doc-1", doc, "report")
        results["summary_4k"] = {"words": words, "tokens": engine.count_tokens(doc), **first.__dict__}
        again = await follow_up(store, chat, "doc-1", "Which numbers does the report mention?")
        results["follow_up"] = {**again.__dict__, "ttft_ratio": again.ttft_seconds / first.ttft_seconds}

        target_tokens = context_multiple * engine.max_model_len
        big_words = int(target_tokens / (engine.count_tokens(doc) / words))
        concurrent = await summarize(store, chat, "big-1", long_document(big_words, seed=202), "big-a")
        sequential_chat = ChatService(engine, settings.replace(summary_concurrency=1))
        sequential = await summarize(
            store, sequential_chat, "big-2", long_document(big_words, seed=303), "big-b"
        )
        results["map_reduce"] = {
            "words": big_words,
            "tokens": target_tokens,
            "concurrent": concurrent.__dict__,
            "sequential": sequential.__dict__,
            "ratio": concurrent.total_seconds / sequential.total_seconds,
        }
        results["unfinished_requests_after"] = engine.unfinished_requests()
    return results


def report(results: dict) -> str:
    s = results["summary_4k"]
    f = results["follow_up"]
    m = results["map_reduce"]
    lines = [
        f"model {results['model']} (context {results['max_model_len']} tokens)",
        "",
        "| measurement | value |",
        "|---|---|",
        f"| {s['words']}-word document ({s['tokens']} tokens): first summary token "
        f"| {s['ttft_seconds']:.2f} s |",
        f"| same: whole summary | {s['total_seconds']:.2f} s |",
        f"| follow-up question: first token | {f['ttft_seconds']:.2f} s |",
        f"| follow-up TTFT / first TTFT (target <= {TARGET_FOLLOW_UP_RATIO}) | **{f['ttft_ratio']:.2f}x** |",
        f"| {m['words']}-word document (~{m['tokens']} tokens), map concurrent | "
        f"{m['concurrent']['total_seconds']:.1f} s ({m['concurrent']['parts']} parts) |",
        f"| same length, map sequential | {m['sequential']['total_seconds']:.1f} s |",
        f"| concurrent / sequential (target <= {TARGET_MAP_RATIO}) | **{m['ratio']:.2f}x** |",
        f"| engine requests unfinished afterwards | {results['unfinished_requests_after']} |",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="smaller documents (a smoke run)")
    parser.add_argument("--json", type=Path, help="also write the raw numbers here")
    args = parser.parse_args()
    results = run_until_signalled(run(args.quick))
    print(report(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
