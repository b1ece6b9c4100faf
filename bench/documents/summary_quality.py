"""Summary quality on real documents of this machine: the old summary code and today's, side by side.

    .venv/bin/python bench/documents/summary_quality.py --quick          # 3 documents, ~10 min: a smoke run
    .venv/bin/python bench/documents/summary_quality.py --json bench/out/summary-quality.json  # all 14
    .venv/bin/python bench/documents/summary_quality.py --sweep 1.0:0,1.1:0,1.0:0.5 \
        --ids pip-readme,gnupg-help-pt                                   # penalty pairs (penalty_sweep.py)

The documents (bench/data/summary_documents.json: paths, languages, sha256)
are read through the app's own upload path (ChatService.attach_files). For
each document, each side ("before": the code as it was, bench/documents/legacy_summaries.py;
"after": the code now) and each path that applies ("single": one pass, when
document and summary fit the context; "map-reduce": when the document has 2+
chunks), with vLLM's prefix cache emptied before each summary:
  - distinct-4-gram ratio, loop-guard firings (before: would the guard have fired),
    coverage of each section's top TF-IDF terms, length, first-token and total time,
    language match (py3langid) against the document's language;
  - a follow-up question: its time to first token over the summary's, and the
    growth of vLLM's prefix_cache_hits counter during it.
`planned` marks the path the product picks for the document on that side;
the targets are judged on planned runs. --sweep compares repetition_penalty:frequency_penalty
pairs on single-pass summaries (loop guard off, so the penalties alone are measured).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.common import machine_info, run_until_signalled
from bench.documents.arms import engine_for, make_sides, revisions
from bench.documents.corpus import (
    attach,
    force_path,
    load_documents,
    new_session,
    sections_of_document,
    write_checksums,
)
from bench.documents.penalty_sweep import sweep
from bench.documents.quality_metrics import Coverage, distinct_ngram_ratio, echo_measure, identify_language
from bench.documents.quality_overall import overall
from services.chat.service import ChatService
from services.chat.session import ChatSession
from services.config import Settings
from services.engine import (
    ChatEngine,
    LoopGuardConfig,
    RepetitionError,
    SamplingSettings,
    engine_lifespan,
    followed_by,
    repeats_in,
)

QUICK_IDS = ("pip-readme", "libffi-basics", "gnupg-help-pt")
FOLLOW_UP = {
    "en": "Which command or setting does the document mention first?",
    "pt": "Qual é o primeiro comando ou opção que o documento menciona?",
    "de": "Welchen Befehl oder welche Option nennt das Dokument zuerst?",
    "fr": "Quelle commande ou quel réglage le document mentionne-t-il en premier ?",
}
FOLLOW_UP_TOKENS = 48


def prefix_cache_hits() -> float:
    """vLLM's prefix_cache_hits counter (tokens), summed over engines (the in-process engine registers it)."""
    from prometheus_client import REGISTRY

    return sum(
        sample.value
        for metric in REGISTRY.collect()
        if metric.name.startswith("vllm:prefix_cache_hits")
        for sample in metric.samples
        if sample.name.endswith("_total")
    )


async def timed_summary(chat: ChatService, session: ChatSession, request_id: str) -> dict[str, Any]:
    reports: list[str] = []

    async def progress(update) -> None:
        reports.append(update.describe())

    started = time.monotonic()
    first = None
    text = ""
    fired = False
    loops_before = chat.summarizer.loops_stopped
    try:
        async for delta in chat.summarize(session, "", request_id, progress):
            first = first or time.monotonic() - started
            text = followed_by(text, delta)
    except RepetitionError as error:
        text = error.kept_text
        fired = True
    return {
        "text": text,
        "ttft_seconds": first,
        "total_seconds": time.monotonic() - started,
        "final_loop_stopped": fired,
        "part_loops_stopped": chat.summarizer.loops_stopped - loops_before,
        "progress_reports": len(reports),
        "last_progress": reports[-1] if reports else "",
    }


async def timed_follow_up(chat: ChatService, session: ChatSession, question: str, request_id: str) -> dict:
    session.sampling = SamplingSettings(0.0, 1.0, FOLLOW_UP_TOKENS)
    prompt = chat.build_prompt(session, question)
    whole = "<document>" in prompt.messages[0]["content"]
    hits_before = prefix_cache_hits()
    started = time.monotonic()
    first = None
    looped = False
    try:
        async for _ in chat.reply(session, prompt, request_id):
            first = first or time.monotonic() - started
    except RepetitionError:
        looped = True
    await asyncio.sleep(0.2)  # vLLM's stat logger records the step that served the first token
    return {
        "ttft_seconds": first,
        "document_whole_in_prompt": whole,
        "loop_guard_fired": looped,
        "prompt_tokens": len(chat.engine.encode_chat(prompt.messages)),
        "prefix_cache_hits_tokens": prefix_cache_hits() - hits_before,
    }


async def one_run(
    engine: ChatEngine, chat: ChatService, doc: dict, side: str, path: str, coverage: Coverage
) -> dict:
    """One summary and its follow-up, with the prefix cache emptied first."""
    session = new_session(chat, f"{side}-{path}-{doc['id']}")
    notes = await attach(chat, session, doc)
    planned_whole = session.document.plan.whole if session.document.plan else True
    planned = planned_whole == (path == "single")
    if side == "before":
        legacy_plan = chat.summarizer.plan(chat._job(session, ""), session.document.tokens)
        planned = legacy_plan.whole == (path == "single")
    if not force_path(chat, session, path):
        return {"skipped": f"the document does not fit the {path} path"}
    await engine._llm.reset_prefix_cache()
    with engine_for(engine, side, chat.settings):
        return await measured_run(engine, chat, session, doc, side, path, coverage, planned, notes)


async def measured_run(
    engine: ChatEngine,
    chat: ChatService,
    session: ChatSession,
    doc: dict,
    side: str,
    path: str,
    coverage: Coverage,
    planned: bool,
    notes: tuple[str, ...],
) -> dict:
    run = await timed_summary(chat, session, f"q-{side}-{path}-{doc['id']}")
    text = run.pop("text")
    echo = echo_measure(text, chat.summarizer.prompts(chat._job(session, "")), chat.settings, doc["text"])
    share, per_section = coverage.of(doc["sections"], text)
    would = repeats_in(
        engine.tokenizer.encode(text, add_special_tokens=False),
        LoopGuardConfig.from_settings(chat.settings),
        engine.tokenizer.decode,
        echoes=True,
    )
    language = identify_language(text)
    if side == "before":
        session.document.plan = None  # the old follow-up rule
    follow = await timed_follow_up(chat, session, FOLLOW_UP[doc["language"]], f"f-{side}-{path}-{doc['id']}")
    ratio = (
        follow["ttft_seconds"] / run["ttft_seconds"]
        if run["ttft_seconds"] and follow["ttft_seconds"]
        else None
    )
    return {
        "planned": planned,
        "notes": list(notes),
        **run,
        "summary_words": len(text.split()),
        "summary_tokens": engine.count_tokens(text),
        "distinct_4": distinct_ngram_ratio(text),
        "loop_guard_fired": run["final_loop_stopped"] or run["part_loops_stopped"] > 0,
        "loop_guard_would_fire_on_summary": would is not None,
        "coverage": share,
        "coverage_per_section": per_section,
        "language": language,
        "language_match": language == doc["language"],
        "follow_up": {**follow, "ttft_ratio": ratio},
        "echo": echo,
        "summary": text,
    }


async def run(
    ids: set[str] | None,
    paths: tuple[str, ...],
    only: tuple[str, ...] = ("before", "after"),
    save: Path | None = None,
) -> dict:
    """Every document on every path and side; with `save`, the results so far are written after each
    document (a slow or interrupted run keeps what it measured; `--overall-of` scores it)."""
    settings = Settings.from_env({})
    docs, skipped = load_documents(ids)
    results: dict[str, Any] = {"machine_before": machine_info(), "skipped": skipped, "documents": []}
    async with engine_lifespan(settings) as engine:
        for doc in docs:
            doc["sections"] = sections_of_document(engine, doc)
        coverage = Coverage([doc["sections"] for doc in docs])
        services = make_sides(engine, settings, only)
        results["settings"] = {k: v for k, v in settings.non_default().items()}
        results["revisions"] = revisions(services)
        results["max_model_len"] = engine.max_model_len
        for index, doc in enumerate(docs):
            entry = {k: doc[k] for k in ("id", "path", "language", "size")}
            entry["tokens"] = engine.count_tokens(doc["text"])
            entry["sections"] = len(doc["sections"])
            entry["runs"] = {}
            order = list(only[index % len(only) :] + only[: index % len(only)])  # each side leads in turn
            for path in paths:
                for side in order:
                    started = time.monotonic()
                    outcome = await one_run(engine, services[side], doc, side, path, coverage)
                    entry["runs"][f"{side}/{path}"] = outcome
                    seconds = time.monotonic() - started
                    print(
                        f"{doc['id']:<30} {side:<6} {path:<10} {summary_line(outcome)} ({seconds:.0f} s)",
                        flush=True,
                    )
            results["documents"].append(entry)
            if save:
                save.parent.mkdir(parents=True, exist_ok=True)
                save.write_text(json.dumps(results, indent=2, ensure_ascii=False))
        results["unfinished_requests_after"] = engine.unfinished_requests()
    results["machine_after"] = machine_info()
    results["overall"] = overall(results["documents"])
    return results


def summary_line(outcome: dict) -> str:
    if "skipped" in outcome:
        return f"skipped: {outcome['skipped']}"
    ratio = outcome["follow_up"]["ttft_ratio"]
    hits = outcome["follow_up"]["prefix_cache_hits_tokens"]
    looped = outcome["loop_guard_fired"] or outcome["loop_guard_would_fire_on_summary"]
    return (
        f"planned={outcome['planned']!s:<5} d4={outcome['distinct_4']:.2f} cov={outcome['coverage']:.2f} "
        f"lang={outcome['language']} loop={looped} "
        f"ttft={outcome['ttft_seconds'] or 0:.1f}s total={outcome['total_seconds']:.1f}s "
        f"follow={'-' if ratio is None else f'{ratio:.2f}x'} hits={hits:.0f} "
        f"echo={outcome['echo']['echoed']}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help=f"only {', '.join(QUICK_IDS)}")
    parser.add_argument("--ids", help="comma-separated document ids (default: all)")
    parser.add_argument("--paths", default="single,map-reduce", help="which paths to run")
    parser.add_argument("--sides", default="before,after", help="which sides to run")
    parser.add_argument("--sweep", help="repetition_penalty:frequency_penalty pairs, comma-separated")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--overall-of", type=Path, help="recompute the overall numbers of a saved run")
    parser.add_argument(
        "--write-checksums", action="store_true", help="record the documents' sha256 and exit"
    )
    args = parser.parse_args()
    if args.write_checksums:
        write_checksums()
        return
    if args.overall_of:
        saved = json.loads(args.overall_of.read_text())
        saved["overall"] = overall(saved["documents"])
        args.overall_of.write_text(json.dumps(saved, indent=2, ensure_ascii=False))
        print(json.dumps(saved["overall"], indent=2))
        return
    ids = set(QUICK_IDS) if args.quick else set(args.ids.split(",")) if args.ids else None
    if args.sweep:
        results = run_until_signalled(sweep(ids, args.sweep))
    else:
        paths = tuple(args.paths.split(","))
        sides = tuple(args.sides.split(","))
        results = run_until_signalled(run(ids, paths, sides, args.json))
    print(json.dumps(results["overall"], indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2, ensure_ascii=False))


if __name__ == "__main__":
    main()
