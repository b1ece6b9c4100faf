"""Which repetition_penalty / frequency_penalty pair gives the best single-pass summaries here.

Run by bench/documents/summary_quality.py --sweep. For each document every pair runs
at once (they share the document's prefix in vLLM's cache, so the document is
read once), with the loop guard off, so that the penalties alone are measured:
distinct-4-gram ratio, whether the guard would have fired, coverage, language.
"""

from __future__ import annotations

import asyncio
import functools
import time
from typing import Any

from bench.common import machine_info
from bench.documents.corpus import (
    attach,
    force_path,
    load_documents,
    new_session,
    sections_of_document,
)
from bench.documents.quality_metrics import Coverage, distinct_ngram_ratio, identify_language
from services.chat.service import ChatService
from services.config import Settings
from services.engine import LoopGuardConfig, engine_lifespan, followed_by, repeats_in


def parse_pairs(text: str) -> list[tuple[float, float]]:
    pairs = []
    for item in text.split(","):
        repetition, frequency = item.split(":")
        pairs.append((float(repetition), float(frequency)))
    return pairs


async def one(chat: ChatService, doc: dict, label: str) -> str:
    session = new_session(chat, f"sweep-{label}-{doc['id']}")
    await attach(chat, session, doc)
    if not force_path(chat, session, "single"):
        return ""
    return functools.reduce(
        followed_by, [delta async for delta in chat.summarize(session, "", f"sweep-{label}-{doc['id']}")], ""
    )


async def sweep(ids: set[str] | None, pairs_text: str) -> dict[str, Any]:
    settings = Settings.from_env({})
    pairs = parse_pairs(pairs_text)
    docs, skipped = load_documents(ids)
    results: dict[str, Any] = {"machine_before": machine_info(), "skipped": skipped, "runs": []}
    async with engine_lifespan(settings.replace(loop_guard_min_tokens=0)) as engine:  # the guard off
        guard = LoopGuardConfig.from_settings(settings)
        for doc in docs:
            doc["sections"] = sections_of_document(engine, doc)
        coverage = Coverage([doc["sections"] for doc in docs])
        services = {
            f"{r}:{f}": ChatService(engine, settings.replace(repetition_penalty=r, frequency_penalty=f))
            for r, f in pairs
        }
        for doc in docs:
            started = time.monotonic()
            texts = await asyncio.gather(*(one(chat, doc, label) for label, chat in services.items()))
            for label, text in zip(services, texts, strict=True):
                ids_ = engine.tokenizer.encode(text, add_special_tokens=False)
                run = {
                    "document": doc["id"],
                    "language": doc["language"],
                    "pair": label,
                    "distinct_4": distinct_ngram_ratio(text),
                    "coverage": coverage.of(doc["sections"], text)[0],
                    "would_fire": repeats_in(ids_, guard, engine.tokenizer.decode) is not None,
                    "language_match": identify_language(text) == doc["language"],
                    "words": len(text.split()),
                    "summary": text,
                }
                results["runs"].append(run)
                print(
                    f"{doc['id']:<30} {label:<8} d4={run['distinct_4']:.2f} cov={run['coverage']:.2f} "
                    f"fire={run['would_fire']} lang={run['language_match']} words={run['words']}",
                    flush=True,
                )
            print(f"  ({time.monotonic() - started:.0f} s)", flush=True)
    results["overall"] = {
        label: summarize_pair([r for r in results["runs"] if r["pair"] == label]) for label in services
    }
    results["machine_after"] = machine_info()
    return results


def summarize_pair(runs: list[dict]) -> dict[str, Any]:
    count = max(len(runs), 1)
    return {
        "runs": len(runs),
        "mean_distinct_4": sum(r["distinct_4"] for r in runs) / count,
        "min_distinct_4": min((r["distinct_4"] for r in runs), default=None),
        "below_0.9": sum(r["distinct_4"] < 0.9 for r in runs),
        "would_fire": sum(r["would_fire"] for r in runs),
        "mean_coverage": sum(r["coverage"] for r in runs) / count,
        "language_match": sum(r["language_match"] for r in runs) / count,
        "mean_words": sum(r["words"] for r in runs) / count,
    }
