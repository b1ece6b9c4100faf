"""How fast the sidebar's full-text search answers over a large history, on SQLite and PostgreSQL.

    .venv/bin/python bench/history/search.py --save-results          # ~15-25 minutes, no engine
    .venv/bin/python bench/history/search.py --conversations 1000    # quick
    .venv/bin/python bench/history/search.py --http                  # + the server's HTTP route

For each database (SQLite in a temp folder; PostgreSQL in a throwaway cluster, harness/postgres.py):
  1. the schema from the app's migrations without the search index (migrations 11 and 14);
  2. `--conversations` conversations of `--turns` messages for `--people` people, written straight
     into the tables (search_corpus.py: Zipf-distributed words);
  3. migrations 11 and 14 as the app runs them at start: the time to build and backfill the index, and
     its size (PostgreSQL: then VACUUM ANALYZE, as autovacuum soon would);
  4. each query of QUERIES (1-3 words, from the most common word to absent ones, prefixes while
     typing) as several people, `--repeats` times, through the app's own data layer
     (`ChatDataLayer.list_threads`, a page of 20 as the sidebar asks): P50/P95/P99 per kind and overall,
     of the wall time and of the CPU time (this process's; PostgreSQL's server processes' apart);
  5. the cost the index adds to saving a message: `create_step` of new messages through the layer.
With `--http`, a real server (the tiny model) on the SQLite database answers a handful of queries at
POST /project/threads, signed in as one of the people: the whole path, cookie to JSON.
The databases are deleted at the end (`--keep` keeps them). Writes bench/out/search-<time>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from chainlit.context import init_http_context
from chainlit.types import Pagination, ThreadFilter

from bench.common import OUT, machine_info, percentile, result_path
from bench.history import search_corpus
from bench.history.search_stores import (
    SEARCH_VERSIONS,
    build_postgres,
    build_sqlite,
    http_latencies,
    index_sizes,
    server_cpu_seconds,
    vacuum,
)
from services.config import Settings
from services.history.conversations import timestamp
from services.history.database import create_engine
from services.history.migrations import migrate
from services.history.service import History

TARGET_P95_MS = 100.0
PAGE = 20  # what the sidebar's search asks for


def queries(seed: int) -> dict[str, list[str]]:
    """Queries by kind, from the corpus's own vocabulary ranked by frequency (0 = most common)."""
    import numpy as np

    words = search_corpus.vocabulary(search_corpus.VOCABULARY, np.random.default_rng(seed))
    return {
        "very common word": [words[0], words[3], words[9]],
        "common word": [words[60], words[150], words[400]],
        "medium word": [words[1500], words[4000], words[8000]],
        "rare word": [words[25_000], words[40_000], words[49_000]],
        "absent word": ["zzyzxq", "qwertyuiopasd"],
        "two words": [
            f"{words[5]} {words[2000]}",
            f"{words[300]} {words[700]}",
            f"{words[1200]} {words[30_000]}",
        ],
        "three words": [f"{words[1]} {words[80]} {words[900]}", f"{words[3000]} {words[3500]} {words[6000]}"],
        "typing (prefix)": [
            words[1500][:3],
            words[4000][:4],
            f"{words[200]} {words[2500][:3]}",
            words[40][:2],
        ],
    }


async def run_queries(settings: Settings, user_ids: list[str], options: argparse.Namespace) -> dict[str, Any]:
    """Every query as each of the first people, through the app's data layer; latencies by kind."""
    history = History(settings, keep_conversations=True, use_database=True)
    await history.start()
    init_http_context()
    layer = history.layer
    assert layer is not None
    by_kind: dict[str, list[float]] = {}
    # CPU time of this process: all of SQLite's work (in process), only the client's on PostgreSQL.
    # On a loaded machine it says what a search costs when the wall time mostly waits for a core.
    cpu_by_kind: dict[str, list[float]] = {}
    server_cpu_by_kind: dict[str, list[float]] = {}  # PostgreSQL's processes (SQLite: 0, in cpu_by_kind)
    found: dict[str, int] = {}
    people = user_ids[: options.searchers]
    load_before = os.getloadavg()
    for round_index in range(options.repeats + 1):  # round 0 warms the caches and is not counted
        for kind, texts in queries(options.seed).items():
            for text in texts:
                for user_id in people:
                    server = server_cpu_seconds(settings)
                    started = time.perf_counter()
                    cpu = time.process_time()
                    page = await layer.list_threads(
                        Pagination(first=PAGE), ThreadFilter(userId=user_id, search=text)
                    )
                    elapsed = (time.perf_counter() - started) * 1000
                    if round_index:
                        by_kind.setdefault(kind, []).append(elapsed)
                        cpu_by_kind.setdefault(kind, []).append((time.process_time() - cpu) * 1000)
                        server_ms = (server_cpu_seconds(settings) - server) * 1000
                        server_cpu_by_kind.setdefault(kind, []).append(server_ms)
                    found[text] = len(page.data)
    load_after = os.getloadavg()  # the machine's load while the queries ran (other work slows them)
    saving = await saving_latencies(layer, user_ids[0], options.saves)
    failures = history.health.failures_total
    await history.stop()
    return {
        "by_kind": summarize(by_kind),
        "all": summary([v for values in by_kind.values() for v in values]),
        "found_on_first_page": found,
        "statement_failures": failures,
        "save_message_ms": saving,
        "cpu_ms_by_kind": summarize(cpu_by_kind),
        "cpu_ms_all": summary([v for values in cpu_by_kind.values() for v in values]),
        "server_cpu_ms_by_kind": summarize(server_cpu_by_kind),
        "server_cpu_ms_all": summary([v for values in server_cpu_by_kind.values() for v in values]),
        "load_average_before_after": [load_before, load_after],
    }


async def saving_latencies(layer: Any, user_id: str, count: int) -> dict[str, Any]:
    """Milliseconds to store a message through the data layer (the index's triggers included)."""
    thread_id = str(uuid.uuid4())
    times = []
    await layer.update_thread(thread_id, name="saving bench", user_id=user_id)
    for i in range(count):
        step = {
            "id": str(uuid.uuid4()),
            "threadId": thread_id,
            "type": "user_message",
            "name": "User",
            "output": f"a new message number {i} about volcano glaciers",
            "createdAt": timestamp(datetime.now(UTC)),
        }
        started = time.perf_counter()
        await layer.create_step(step)
        times.append((time.perf_counter() - started) * 1000)
    await layer.delete_thread(thread_id)
    return summary(times)


def summary(values: list[float]) -> dict[str, Any]:
    return {
        "n": len(values),
        **{f"p{q}": round(percentile(values, q) or 0, 2) for q in (50, 95, 99)},
        "max": round(max(values), 2) if values else None,
    }


def summarize(by_kind: dict[str, list[float]]) -> dict[str, Any]:
    return {kind: summary(values) for kind, values in by_kind.items()}


async def add_index(settings: Settings) -> dict[str, Any]:
    """The search index's migrations (11, 14) on the filled database, as the app's start runs them."""
    engine = create_engine(settings)
    before = await index_sizes(engine)
    started = time.perf_counter()
    applied = await migrate(engine)
    seconds = time.perf_counter() - started
    after = await index_sizes(engine)
    started = time.perf_counter()
    await migrate(engine)
    again = time.perf_counter() - started
    await engine.dispose()
    assert applied == list(SEARCH_VERSIONS), applied
    return {
        "build_seconds": round(seconds, 2),
        "rerun_seconds": round(again, 3),
        "before": before,
        "after": after,
        "vacuum_seconds": await vacuum(settings),
    }


async def one_database(name: str, folder: Path, options: argparse.Namespace) -> dict[str, Any]:
    build = build_postgres if name == "postgresql" else build_sqlite
    async with build(folder, options) as (settings, user_ids, fill_seconds):
        print(f"{name}: filled in {fill_seconds:.1f} s; building the index", flush=True)
        index = await add_index(settings)
        print(f"{name}: index {json.dumps(index)}", flush=True)
        measured = await run_queries(settings, user_ids, options)
        print(f"{name}: {json.dumps(measured['all'])}", flush=True)
        result = {"fill_seconds": round(fill_seconds, 1), "index": index, **measured}
        if options.http and name == "sqlite":
            try:
                result["http"] = await http_latencies(folder, options, queries(options.seed))
            except (TimeoutError, RuntimeError, OSError) as error:  # a busy machine: keep what was measured
                result["http"] = {"error": str(error)}
            print(f"{name}: http {json.dumps(result['http'])}", flush=True)
        return result


async def run(options: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for name in options.databases.split(","):
        with tempfile.TemporaryDirectory(prefix="search-bench-") as folder:
            results[name] = await one_database(name, Path(folder), options)
        report(options, results, final=False)  # what was measured so far, should a later part fail
    return report(options, results, final=True)


def report(options: argparse.Namespace, results: dict[str, Any], final: bool) -> dict[str, Any]:
    verdict = {name: (r["all"]["p95"] or 0) <= TARGET_P95_MS for name, r in results.items()}
    summary = {
        "machine": machine_info(),
        "options": vars(options),
        "target_p95_ms": TARGET_P95_MS,
        "meets_target": verdict,
        "queries": queries(options.seed),
        "databases": results,
    }
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"search-{'last' if final else 'partial'}.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--conversations", type=int, default=10_000)
    parser.add_argument("--turns", type=int, default=50, help="messages per conversation")
    parser.add_argument("--people", type=int, default=10, help="the conversations are shared out among them")
    parser.add_argument("--searchers", type=int, default=5, help="people each query is run as")
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds (after one warm-up round)")
    parser.add_argument("--saves", type=int, default=300, help="messages saved to time the triggers")
    parser.add_argument("--databases", default="sqlite,postgresql")
    parser.add_argument("--http", action="store_true", help="also through a real server (SQLite)")
    parser.add_argument("--http-repeats", type=int, default=10, help="timed requests per HTTP query")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--save-results", action="store_true", help="copy to bench/results/history/")
    options = parser.parse_args()
    report = asyncio.run(run(options))
    OUT.mkdir(parents=True, exist_ok=True)
    paths = [OUT / f"search-{time.strftime('%Y%m%d-%H%M')}.json"]
    if options.save_results:
        paths.append(result_path("history", "search"))
    for path in paths:
        path.write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n")
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
