"""The search benchmark's databases: filled through the app's schema (without the search index, which
search.py then adds as the app's start would), their index sizes, and a real server over one."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, closing
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import psutil
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from bench.common import OUT, percentile
from bench.history import search_corpus
from bench.history.search_corpus import STEP_COLUMNS, THREAD_COLUMNS, USER_COLUMNS
from harness.postgres import PostgresCluster
from services.accounts.passwords import hash_password
from services.config import Settings
from services.history import migrations
from services.history.conversations import timestamp
from services.history.database import create_engine, sqlite_path

PASSWORD = "search-bench-password-1"  # bench-0's, for the HTTP part
SEARCH_VERSIONS = (11, 14)  # the index (search_index.py) and its upgrade (search_index_upgrade.py)
BATCH = 200  # conversations written per statement batch


async def schema_without_search(settings: Settings) -> None:
    """The app's migrations, all but the search index's."""
    engine = create_engine(settings)
    every = migrations.MIGRATIONS
    migrations.MIGRATIONS = tuple(m for m in every if m.version not in SEARCH_VERSIONS)
    try:
        await migrations.migrate(engine)
    finally:
        migrations.MIGRATIONS = every
        await engine.dispose()


def people_rows(count: int) -> list[tuple]:
    now = timestamp(datetime.now(UTC))
    return [
        (
            str(uuid.uuid4()),
            f"bench-{i}",
            json.dumps({"role": "user"}),
            now,
            hash_password(PASSWORD) if i == 0 else None,
            "user",
            False,
            now,
        )
        for i in range(count)
    ]


def batches(options: Any, users: list[tuple]) -> Any:
    """Rows of threads and steps, BATCH conversations at a time."""
    threads: list[tuple] = []
    steps: list[tuple] = []
    for conversation in search_corpus.conversations(options.conversations, options.turns, options.people):
        user = users[conversation.user_index]
        threads.append(search_corpus.thread_row(conversation, user[0], user[1]))
        steps.extend(search_corpus.step_rows(conversation))
        if len(threads) == BATCH:
            yield threads, steps
            threads = []
            steps = []
    if threads:
        yield threads, steps


def _insert(table: str, columns: tuple[str, ...]) -> str:
    names = ", ".join(f'"{c}"' for c in columns)
    return f"INSERT INTO {table} ({names}) VALUES ({', '.join('?' for _ in columns)})"


@asynccontextmanager
async def build_sqlite(folder: Path, options: Any) -> AsyncIterator[tuple[Settings, list[str], float]]:
    settings = Settings.from_env({"DATA_DIR": str(folder / "data")})
    await schema_without_search(settings)
    path = sqlite_path(settings)
    assert path is not None
    started = time.perf_counter()
    users = people_rows(options.people)
    with closing(sqlite3.connect(path)) as db, db:
        db.executemany(_insert("users", USER_COLUMNS), users)
        for threads, steps in batches(options, users):
            db.executemany(_insert("threads", THREAD_COLUMNS), threads)
            db.executemany(_insert("steps", STEP_COLUMNS), steps)
    yield settings, [u[0] for u in users], time.perf_counter() - started


@asynccontextmanager
async def build_postgres(folder: Path, options: Any) -> AsyncIterator[tuple[Settings, list[str], float]]:
    cluster = PostgresCluster().start()
    try:
        url = cluster.create_database("search")
        settings = Settings.from_env({"DATA_DIR": str(folder / "data"), "DATABASE_URL": url})
        await schema_without_search(settings)
        started = time.perf_counter()
        users = people_rows(options.people)
        connection = await asyncpg.connect(url)
        try:
            await connection.copy_records_to_table("users", records=users, columns=list(USER_COLUMNS))
            for threads, steps in batches(options, users):
                await connection.copy_records_to_table(
                    "threads", records=threads, columns=list(THREAD_COLUMNS)
                )
                await connection.copy_records_to_table("steps", records=steps, columns=list(STEP_COLUMNS))
            await connection.execute("ANALYZE")
        finally:
            await connection.close()
        yield settings, [u[0] for u in users], time.perf_counter() - started
    finally:
        cluster.remove()


def server_cpu_seconds(settings: Settings) -> float:
    """CPU seconds the database server has used so far: PostgreSQL's processes (the throwaway cluster
    on this machine, found by its port; their run time in ns from /proc/PID/schedstat, plus the 10 ms
    ticks of exited ones, such as parallel workers); 0 for SQLite, which runs in this process."""
    if not settings.database_url:
        return 0.0
    port = f"-p {settings.database_url.rsplit(':', 1)[1].split('/')[0]} "
    total = 0.0
    for process in psutil.process_iter(["cmdline"]):
        if port not in " ".join(process.info["cmdline"] or []) + " ":
            continue
        with contextlib.suppress(psutil.Error, OSError):
            times = process.cpu_times()
            total += times.children_user + times.children_system
            for member in [process, *process.children(recursive=True)]:
                total += int(Path(f"/proc/{member.pid}/schedstat").read_text().split()[0]) / 1e9
    return total


async def vacuum(settings: Settings) -> float | None:
    """PostgreSQL: VACUUM ANALYZE what migration 14 rewrote (as autovacuum soon would, and would do
    while the searches run): its seconds. SQLite: nothing to do (None)."""
    if not settings.database_url:
        return None
    started = time.perf_counter()
    connection = await asyncpg.connect(settings.database_url)
    try:
        for table in ("steps", "threads"):
            await connection.execute(f"VACUUM ANALYZE {table}", timeout=3600)
    finally:
        await connection.close()
    return round(time.perf_counter() - started, 1)


async def index_sizes(engine: AsyncEngine) -> dict[str, int]:
    """Bytes of the search index and of the whole database."""
    async with engine.connect() as connection:
        if engine.dialect.name == "postgresql":
            row = (
                await connection.execute(
                    text(
                        "SELECT COALESCE((SELECT SUM(pg_relation_size(oid)) FROM pg_class "
                        "WHERE relname IN ('steps_search', 'threads_search', 'steps_search_owner')), 0), "
                        "pg_total_relation_size('steps') + pg_total_relation_size('threads'), "
                        "pg_database_size(current_database())"
                    )
                )
            ).one()
            return {
                "gin_index_bytes": int(row[0]),
                "steps_threads_bytes": int(row[1]),
                "database_bytes": int(row[2]),
            }
        await connection.execute(text("PRAGMA wal_checkpoint(TRUNCATE)"))
        rows = (await connection.execute(text("SELECT name, SUM(pgsize) FROM dbstat GROUP BY name"))).all()
    index = sum(size for name, size in rows if name.startswith("conversation_search"))
    return {"index_bytes": int(index), "database_bytes": int(sum(size for _, size in rows))}


async def http_latencies(folder: Path, options: Any, queries: dict[str, list[str]]) -> dict[str, Any]:
    """A handful of queries at POST /project/threads of a real server on the SQLite database."""
    from harness.chat_client import sign_in
    from harness.server import AppServer
    from harness.tiny_model import build_tiny_model
    from services.config.engine import default_cache_dir
    from services.engine.backends.local import ensure_default_model

    model = build_tiny_model(
        ensure_default_model(Settings.from_env({})), Path(default_cache_dir()) / "bench-tiny"
    )
    env = {
        "MODEL": str(model),
        "MAX_MODEL_LEN": "4096",
        "MAX_NUM_BATCHED_TOKENS": "4096",
        "AUTH_MODE": "password",
        "ADMIN_USERNAME": "admin",
        "ADMIN_PASSWORD": "bench-admin-password-1",
        "HISTORY_RETENTION_DAYS": "0",
        "HISTORY_MAX_CONVERSATIONS": "0",
        "DATA_DIR": str(folder / "data"),
    }
    server = AppServer(env, OUT / "search-http-server.log").start(timeout=900)  # slow on a busy machine
    times: dict[str, list[float]] = {}
    try:
        cookie = await sign_in(server.base_url, "bench-0", PASSWORD)
        async with httpx.AsyncClient(base_url=server.base_url, headers={"Cookie": cookie or ""}) as http:
            for kind, texts in queries.items():
                body = {"pagination": {"first": 20}, "filter": {"search": texts[0]}}
                for round_index in range(options.http_repeats + 1):
                    started = time.perf_counter()
                    response = await http.post("/project/threads", json=body, timeout=30)
                    response.raise_for_status()
                    if round_index:  # the first is a warm-up
                        times.setdefault(f"{kind}: {texts[0]}", []).append(
                            (time.perf_counter() - started) * 1000
                        )
    finally:
        server.stop()
    every = [v for values in times.values() for v in values]
    return {
        "by_query": {q: round(percentile(v, 50) or 0, 2) for q, v in times.items()},
        "all": {f"p{q}": round(percentile(every, q) or 0, 2) for q in (50, 95, 99)} | {"n": len(every)},
    }
