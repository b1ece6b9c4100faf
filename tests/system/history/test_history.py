"""Stored conversations on real SQLite and PostgreSQL, without a model: schema, Chainlit's data layer
through our subclass, documents, deletion, retention, a database in trouble, and the rebuild rules."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sqlite3
import time
import typing
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import pytest_asyncio
from chainlit.context import init_http_context
from chainlit.element import ElementDict
from chainlit.step import StepDict
from chainlit.types import Feedback, Pagination, ThreadFilter
from sqlalchemy import event, inspect, text

from harness.postgres import PostgresCluster
from harness.waiting import until
from services.accounts.store import AccountStore
from services.chat.session import SessionDocument
from services.chat.store import SessionStore
from services.config import Settings
from services.history import conversations, database, thread_list
from services.history.database import POOL_SIZE, sqlite_path
from services.history.migrations import CHAINLIT_COLUMNS, MIGRATIONS, migrate
from services.history.resume import ANSWER_METADATA
from services.history.service import History
from tests.system.history.conftest import new_user

MB = 1024 * 1024
BIG_SERIES = (
    "(WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 4000) SELECT i FROM n)"
)


@pytest_asyncio.fixture(params=["sqlite", "postgresql"], loop_scope="module")
async def history(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[History]:
    environ = {"DATA_DIR": str(tmp_path), "HISTORY_RETRY_SECONDS": "0.5", "DATABASE_TIMEOUT_SECONDS": "1"}
    if request.param == "postgresql":
        cluster: PostgresCluster = request.getfixturevalue("postgres")
        environ["DATABASE_URL"] = cluster.create_database(f"h{uuid.uuid4().hex[:12]}")
    history = History(Settings.from_env(environ), keep_conversations=True, use_database=True)
    await history.start()
    init_http_context()  # Chainlit's data layer expects a Chainlit context
    yield history
    await history.stop()


async def new_thread(history: History, user_id: str, messages: int = 2, tags: list[str] | None = None) -> str:
    layer = history.layer
    assert layer is not None
    thread_id = str(uuid.uuid4())
    await layer.update_thread(thread_id, name="first words", user_id=user_id, tags=tags)
    for i in range(messages):
        step: StepDict = {
            "id": str(uuid.uuid4()), "threadId": thread_id, "name": "User" if i % 2 == 0 else "vLLM Chat",
            "type": "user_message" if i % 2 == 0 else "assistant_message", "output": f"message {i}",
            "streaming": False, "createdAt": conversations.timestamp(datetime.now(UTC)),
            "metadata": {} if i % 2 == 0 else dict(ANSWER_METADATA), "command": "", "defaultOpen": False,
        }  # fmt: skip
        await layer.create_step(step)
    return thread_id


async def count(history: History, table: str, where: str = "1=1", **params: object) -> int:
    assert history.engine is not None
    async with history.engine.connect() as connection:
        return (
            await connection.execute(text(f"SELECT COUNT(*) FROM {table} WHERE {where}"), params)
        ).scalar_one()


@pytest.mark.asyncio(loop_scope="module")
async def test_migrations_are_idempotent_and_have_every_column_chainlit_writes(history: History) -> None:
    assert history.engine is not None
    assert await migrate(history.engine) == [], "a second run changes nothing"
    assert await count(history, "schema_migrations") == len(MIGRATIONS)
    async with history.engine.connect() as connection:
        columns = await connection.run_sync(
            lambda sync: {t: {c["name"] for c in inspect(sync).get_columns(t)} for t in CHAINLIT_COLUMNS}
        )
    # Derived from Chainlit's own types: a column it writes and we lack would fail quietly.
    written = {
        "steps": set(typing.get_type_hints(StepDict)) - {"feedback"},
        "elements": set(typing.get_type_hints(ElementDict)) - {"path"},
        "feedbacks": {f for f in Feedback.__dataclass_fields__},
    }
    for table, names in written.items():
        assert names <= columns[table], f"{table} lacks {names - columns[table]}"


@pytest.mark.asyncio(loop_scope="module")
async def test_an_old_chainlit_database_is_upgraded_in_place(tmp_path: Path) -> None:
    path = tmp_path / "chat.db"
    with sqlite3.connect(path) as old:  # Chainlit 2.0's steps table, without the later columns
        old.execute('CREATE TABLE steps ("id" TEXT PRIMARY KEY, "name" TEXT, "type" TEXT, "threadId" TEXT)')
        old.execute("INSERT INTO steps VALUES ('s1', 'User', 'user_message', 't1')")
    history = History(Settings.from_env({"DATA_DIR": str(tmp_path)}), True, True)
    await history.start()
    try:
        assert await count(history, "steps", "\"id\" = 's1'") == 1, "existing rows survive"
        async with history.engine.connect() as connection:  # type: ignore[union-attr]
            names = await connection.run_sync(
                lambda sync: {c["name"] for c in inspect(sync).get_columns("steps")}
            )
        assert {"command", "defaultOpen", "modes", "autoCollapse"} <= names
    finally:
        await history.stop()


@pytest.mark.asyncio(loop_scope="module")
async def test_a_conversation_round_trips_with_tags_feedback_and_document(history: History) -> None:
    layer = history.layer
    assert layer is not None
    user_id = await new_user(history, "alice")
    thread_id = await new_thread(history, user_id, messages=4, tags=["work", "draft"])  # issue #2528
    page = await layer.list_threads(Pagination(first=20), ThreadFilter(userId=user_id))
    assert [t["id"] for t in page.data] == [thread_id]
    thread = await layer.get_thread(thread_id)
    assert thread is not None and thread["tags"] == ["work", "draft"]
    assert [s["output"] for s in thread["steps"]] == [f"message {i}" for i in range(4)]
    assert await layer.get_thread_author(thread_id) == "alice"
    assert await layer.get_thread_author(str(uuid.uuid4())) == "", "unknown: Chainlit answers 404"
    answer = thread["steps"][1]["id"]
    await layer.upsert_feedback(Feedback(forId=answer, value=1, comment="good"))
    assert history.feedback.labels("up")._value.get() == 1
    await history.save_document(thread_id, SessionDocument("notes.txt", "some text", 3))
    await layer.delete_thread(thread_id)
    for table, column in (("threads", '"id"'), ("steps", '"threadId"'), ("thread_documents", "thread_id")):
        assert await count(history, table, f"{column} = :id", id=thread_id) == 0, table
    assert await count(history, "feedbacks") == 0


def answer_step(thread_id: str, output: str) -> StepDict:
    return {"id": str(uuid.uuid4()), "threadId": thread_id, "name": "vLLM Chat", "type": "assistant_message",
            "output": output, "streaming": False, "createdAt": conversations.timestamp(datetime.now(UTC)),
            "metadata": dict(ANSWER_METADATA)}  # fmt: skip


@pytest.mark.asyncio(loop_scope="module")
async def test_a_removed_accounts_writes_under_way_are_dropped_and_its_name_starts_empty(
    history: History,
) -> None:
    assert history.engine is not None and history.layer is not None
    layer, store = history.layer, AccountStore(history.engine)
    name = f"leaver-{uuid.uuid4().hex[:8]}"
    await store.add(name, "the first password")
    leaver = await layer.get_user(name)
    assert leaver is not None
    init_http_context(user=leaver)  # Chainlit writes in the context of the person's session
    kept = await new_thread(history, leaver.id)
    await store.remove(name)  # meanwhile, elsewhere (the accounts command, another replica)
    await layer.create_step(answer_step(kept, "the end of an answer that was streaming"))
    await layer.update_thread(kept, metadata={"chat_settings": {"temperature": 0.5}})  # its tab closes
    late = str(uuid.uuid4())  # a new chat whose first message was sent just before the removal
    await layer.update_thread(late, name="sent just before", user_id=leaver.id)
    await layer.create_step(answer_step(late, "its answer"))
    for table, column in (("threads", '"id"'), ("steps", '"threadId"')):
        assert await count(history, table, f"{column} IN (:a, :b)", a=kept, b=late) == 0, table
    async with history.engine.begin() as connection:  # what an older version let through
        await connection.execute(
            text('INSERT INTO threads ("id", "userId", "userIdentifier") VALUES (:id, :user, :who)'),
            {"id": str(uuid.uuid4()), "user": leaver.id, "who": name},
        )
    await store.add(name, "the next owner's password")  # the name given to someone else
    owner = await layer.get_user(name)
    assert owner is not None and owner.id != leaver.id, "the new owner's user row is not the old one"
    owned = '"userIdentifier" = :who OR "userId" IN (:old, :new)'
    assert await count(history, "threads", owned, who=name, old=leaver.id, new=owner.id) == 0
    await layer.update_thread(str(uuid.uuid4()), name="still the old tab", user_id=leaver.id)
    assert await count(history, "threads", owned, who=name, old=leaver.id, new=owner.id) == 0
    init_http_context(user=owner)
    assert await count(history, "steps", '"threadId" = :id', id=await new_thread(history, owner.id)) == 2


@pytest.mark.asyncio(loop_scope="module")
async def test_a_conversation_id_with_sql_in_it_is_never_stored(history: History) -> None:
    layer = history.layer
    assert layer is not None
    user_id = await new_user(history, "mallory")
    hostile = "x') OR 1=1 --"
    await layer.update_thread(hostile, name="hi", user_id=user_id)
    await layer.create_step({"id": str(uuid.uuid4()), "threadId": hostile, "type": "user_message",
                             "name": "User", "output": "hi", "streaming": False})  # fmt: skip
    assert await count(history, "threads") == 0 and await count(history, "steps") == 0


@pytest.mark.asyncio(loop_scope="module")
async def test_resume_rebuilds_history_settings_and_document(history: History, tmp_path: Path) -> None:
    user_id = await new_user(history, "bob")
    thread_id = await new_thread(history, user_id, messages=6)
    await history.save_document(thread_id, SessionDocument("report.txt", "the text", 2))
    thread = await history.layer.get_thread(thread_id)  # type: ignore[union-attr]
    thread["metadata"] = json.dumps({"chat_settings": {"temperature": 0.7, "system_prompt": "Be brief."}})
    settings = Settings.from_env({"DATA_DIR": str(tmp_path)})
    store = SessionStore(settings)
    session = store.open("s1", "bob")
    await history.restore(store, session, thread)
    assert [m["content"] for m in session.history] == [f"message {i}" for i in range(6)]
    assert session.sampling.temperature == 0.7 and session.system_prompt == "Be brief."
    assert session.document is not None and session.document.name == "report.txt"


def statements_of(history: History) -> list[str]:
    """The statements the history's engine runs from now on (SQLAlchemy's own event)."""
    assert history.engine is not None
    seen: list[str] = []
    event.listen(history.engine.sync_engine, "before_cursor_execute", lambda *args: seen.append(args[2]))
    return seen


@pytest.mark.asyncio(loop_scope="module")
async def test_the_thread_list_pages_in_one_statement_without_messages(history: History) -> None:
    layer = history.layer
    assert layer is not None
    user_id, other = await new_user(history, "lister"), await new_user(history, "someone-else")
    threads = [await new_thread(history, user_id) for _ in range(7)]  # oldest first
    await new_thread(history, other)
    await layer.update_thread(threads[0], metadata={"is_shared": True})
    statements = statements_of(history)
    first = await layer.list_threads(Pagination(first=3), ThreadFilter(userId=user_id))
    assert len(statements) == 1 and "output" not in statements[0], "one statement, no message text read"
    assert [t["id"] for t in first.data] == threads[:-4:-1] and first.pageInfo.hasNextPage
    assert all(t["steps"] == [] and t["name"] == "first words" for t in first.data)
    listed, page = [t["id"] for t in first.data], first
    while page.pageInfo.hasNextPage:
        page = await layer.list_threads(
            Pagination(first=3, cursor=page.pageInfo.endCursor), ThreadFilter(userId=user_id)
        )
        listed += [t["id"] for t in page.data]
    assert listed == threads[::-1]
    assert page.data[-1]["metadata"] == {"is_shared": True} and first.data[0]["metadata"] == {}
    unknown = await layer.list_threads(
        Pagination(first=2, cursor=str(uuid.uuid4())), ThreadFilter(userId=user_id)
    )
    assert [t["id"] for t in unknown.data] == threads[:-3:-1], "an unknown cursor starts from the top"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(thread_list, "THREAD_LIST_PAGE_MAX", 4)
        capped = await layer.list_threads(Pagination(first=10**6), ThreadFilter(userId=user_id))
    assert len(capped.data) == 4 and capped.pageInfo.hasNextPage


@pytest.mark.asyncio(loop_scope="module")
async def test_the_thread_list_filters_and_bounds_names_as_chainlit_does(history: History) -> None:
    layer = history.layer
    assert layer is not None
    user_id = await new_user(history, "searcher")
    plain, special, rated = [await new_thread(history, user_id) for _ in range(3)]
    for thread_id, said in ((special, "Sale: 50%_OFF today"), (plain, "50xxoff")):
        now = conversations.timestamp(datetime.now(UTC))
        step = {"id": str(uuid.uuid4()), "threadId": thread_id, "type": "user_message", "name": "User",
                "output": said, "createdAt": now}  # fmt: skip
        await layer.create_step(step)
    thread = await layer.get_thread(rated)
    assert thread is not None
    await layer.upsert_feedback(Feedback(forId=thread["steps"][1]["id"], value=0, comment="meh"))

    async def ids(**filters: object) -> set[str]:
        page = await layer.list_threads(Pagination(first=20), ThreadFilter(userId=user_id, **filters))
        return {t["id"] for t in page.data}

    assert await ids(search="50%_off") == {special}, "LIKE's wildcards are literal, case is ignored"
    assert await ids(search="MESSAGE 1") == {plain, special, rated}
    assert await ids(feedback=0) == {rated} and await ids(feedback=1) == set()
    await layer.update_thread(plain, name="n" * 10_000)  # a name Chainlit made from a long first message
    assert await count(history, "threads", 'length("name") = 200 AND "id" = :id', id=plain) == 1
    async with history.engine.begin() as connection:  # type: ignore[union-attr]  # stored before the cap
        await connection.execute(
            text('UPDATE threads SET "name" = :n WHERE "id" = :id'), {"n": "m" * MB, "id": rated}
        )
    page = await layer.list_threads(Pagination(first=20), ThreadFilter(userId=user_id))
    assert max(len(t["name"]) for t in page.data) == 200


SLOW_QUERY = (  # a read that holds its connection for a while on either database
    "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < :n) SELECT count(*) AS n FROM c"
)


@pytest.mark.asyncio(loop_scope="module")
async def test_a_burst_of_statements_waits_its_turn_instead_of_opening_the_breaker(history: History) -> None:
    """Many more statements at once than the pool has connections, each holding one longer than the
    pool's timeout (1 s here) shared out: they queue, all succeed, and nothing counts as an outage."""
    layer = history.layer
    assert layer is not None
    await asyncio.gather(*(layer.execute_sql("SELECT 1", {}) for _ in range(POOL_SIZE)))  # connected
    started = time.monotonic()
    single = await layer.execute_sql(SLOW_QUERY, {"n": 100_000})
    held = time.monotonic() - started
    burst = max(60, int(3 * POOL_SIZE / max(held, 0.01)))  # the last one waits ~3 s: past the timeout
    results = await asyncio.gather(*(layer.execute_sql(SLOW_QUERY, {"n": 100_000}) for _ in range(burst)))
    assert single == [{"n": 100_000}]
    assert all(result == [{"n": 100_000}] for result in results), f"{sum(r is None for r in results)} failed"
    assert history.health.failures_total == 0 and history.health.outage == 0 and history.available
    assert time.monotonic() - started > 1.0, "the burst outlasted the pool's timeout, so it really queued"


@pytest.mark.asyncio(loop_scope="module")
async def test_sqlite_page_caches_are_bounded_and_their_bytes_are_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each pooled SQLite connection caches at most SQLITE_CACHE_KIB of pages; /status shows what
    SQLite holds in this process, which stays under the pool's bound after reading a large table."""
    monkeypatch.setattr(database, "SQLITE_CACHE_KIB", 64)
    settings = Settings.from_env({"DATA_DIR": str(tmp_path)})
    history = History(settings, keep_conversations=True, use_database=True)
    await history.start()
    try:
        assert history.engine is not None and history.layer is not None
        async with history.engine.connect() as connection:
            assert (await connection.execute(text("PRAGMA cache_size"))).scalar_one() == -64
            await connection.execute(text("CREATE TABLE filler (x TEXT)"))
            await connection.execute(
                text("INSERT INTO filler SELECT hex(randomblob(2000)) FROM " + BIG_SERIES)
            )
            await connection.commit()
        reads = [
            history.layer.execute_sql("SELECT SUM(LENGTH(x)) AS n FROM filler", {}) for _ in range(POOL_SIZE)
        ]
        assert all(r == [{"n": 4000 * 4000}] for r in await asyncio.gather(*reads))  # ~16 MB read by each
        used = history.status()["sqlite_memory_bytes"]
        assert used is not None and 0 < used < POOL_SIZE * 64 * 1024 + 4 * MB, used  # + schemas, statements
    finally:
        await history.stop()


@pytest.mark.asyncio(loop_scope="module")
async def test_locked_database_degrades_then_saving_resumes(tmp_path: Path) -> None:
    settings = Settings.from_env(
        {"DATA_DIR": str(tmp_path), "DATABASE_TIMEOUT_SECONDS": "0.3", "HISTORY_RETRY_SECONDS": "0.5"}
    )
    history = History(settings, True, True)
    await history.start()
    init_http_context()
    try:
        user_id = await new_user(history, "carol")
        before = await new_thread(history, user_id)
        locker = sqlite3.connect(sqlite_path(settings), timeout=0)
        locker.execute("BEGIN EXCLUSIVE")  # another program holds the write lock
        await new_thread(history, user_id)  # fails: locked
        assert not history.available and history.health.reason == "locked"
        assert "not being saved" in history.health.message
        locker.rollback()
        locker.close()
        await until(lambda: history.available, "the probe noticed the database is back")  # every 0.5 s
        after = await new_thread(history, user_id)
        thread = await history.layer.get_thread(before)  # type: ignore[union-attr]
        assert thread is not None and len(thread["steps"]) == 2, "what was stored is intact"
        assert await history.layer.get_thread(after) is not None, "saving resumed"  # type: ignore[union-attr]
    finally:
        await history.stop()


@pytest.mark.asyncio(loop_scope="module")
async def test_postgres_going_away_degrades_and_recovers(postgres: PostgresCluster, tmp_path: Path) -> None:
    url = postgres.create_database(f"h{uuid.uuid4().hex[:12]}")
    settings = Settings.from_env(
        {"DATABASE_URL": url, "DATABASE_TIMEOUT_SECONDS": "1", "HISTORY_RETRY_SECONDS": "0.5"}
    )
    history = History(settings, True, True)
    await history.start()
    init_http_context()
    try:
        user_id = await new_user(history, "dave")
        kept = await new_thread(history, user_id)
        postgres.stop()
        try:
            await new_thread(history, user_id)
            assert not history.available and history.health.reason == "unreachable"
        finally:
            postgres.start()
        await until(lambda: history.available, "the probe noticed PostgreSQL is back")  # every 0.5 s
        again = await new_thread(history, user_id)
        assert await history.layer.get_thread(again) is not None  # type: ignore[union-attr]
        assert len((await history.layer.get_thread(kept))["steps"]) == 2  # type: ignore[index, union-attr]
    finally:
        await history.stop()


@pytest.mark.asyncio(loop_scope="module")
async def test_retention_deletes_idle_conversations_only(history: History) -> None:
    user_id = await new_user(history, "erin")
    old, recent = await new_thread(history, user_id), await new_thread(history, user_id)
    long_ago = conversations.timestamp(datetime.now(UTC) - timedelta(days=40))
    async with history.engine.begin() as connection:  # type: ignore[union-attr]
        await connection.execute(
            text('UPDATE steps SET "createdAt" = :t WHERE "threadId" = :id'), {"t": long_ago, "id": old}
        )
        await connection.execute(
            text('UPDATE threads SET "createdAt" = :t WHERE "id" = :id'), {"t": long_ago, "id": old}
        )
    assert await conversations.delete_idle_threads(history.engine, older_than_days=30) == 1  # type: ignore[arg-type]
    remaining = await count(history, "threads")
    assert remaining == 1 and await count(history, "threads", '"id" = :id', id=recent) == 1


@pytest.mark.asyncio(loop_scope="module")
async def test_cap_keeps_each_users_most_recently_active_conversations(history: History) -> None:
    frank, gina = await new_user(history, "frank"), await new_user(history, "gina")
    franks = [await new_thread(history, frank) for _ in range(5)]
    ginas = [await new_thread(history, gina) for _ in range(2)]
    async with history.engine.begin() as connection:  # type: ignore[union-attr]
        for days_ago, thread_id in zip([1, 5, 2, 4, 3], franks, strict=True):  # last message, days ago
            at = conversations.timestamp(datetime.now(UTC) - timedelta(days=days_ago))
            await connection.execute(text('UPDATE steps SET "createdAt" = :t WHERE "threadId" = :id'),
                                     {"t": at, "id": thread_id})  # fmt: skip
    capped = {"history_max_conversations": 3, "history_retention_days": 0}
    history.settings = dataclasses.replace(history.settings, **capped)  # type: ignore[arg-type]
    history._retention_at = None
    assert await history.retention_round() == 2  # the round applies the cap
    kept = {row for row in franks if await count(history, "threads", '"id" = :id', id=row)}
    assert kept == {franks[0], franks[2], franks[4]}, "the three most recently active stay"
    assert await count(history, "steps", '"threadId" IN (:a, :b)', a=franks[1], b=franks[3]) == 0
    assert all([await count(history, "threads", '"id" = :id', id=row) for row in ginas]), "others untouched"
    assert await history.retention_round() == 0, "a second round within the interval does nothing"
    await new_thread(history, frank)
    history._retention_at -= conversations.HISTORY_RETENTION_INTERVAL_SECONDS  # type: ignore[operator]
    assert await history.retention_round() == 1, "the next interval's sweep keeps the cap"
    assert await conversations.delete_excess_threads(history.engine, keep=3) == 0  # type: ignore[arg-type]


@pytest.mark.asyncio(loop_scope="module")
async def test_a_sweep_deletes_a_batch_a_round_until_the_cap_holds(
    history: History, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sweep's excess goes in small transactions over several rounds, not in one burst."""
    monkeypatch.setattr(conversations, "DELETE_BATCH", 2)
    hana = await new_user(history, "hana")
    for _ in range(6):
        await new_thread(history, hana)
    capped = {"history_max_conversations": 1, "history_retention_days": 0}
    history.settings = dataclasses.replace(history.settings, **capped)  # type: ignore[arg-type]
    history._retention_at = None
    rounds = [await history.retention_round() for _ in range(5)]
    assert rounds == [2, 2, 1, 0, 0], "a batch a round, then the sweep waits for the next interval"
    assert await count(history, "threads", '"userIdentifier" = :who', who="hana") == 1


async def new_long_thread(history: History, user_id: str, turns: int) -> tuple[str, list[str]]:
    """A conversation of `turns` turns stored as the app stores them (message, run, answer, a minute
    apart); returns its id and the answers' ids."""
    layer = history.layer
    assert layer is not None
    thread_id, answers = str(uuid.uuid4()), []
    await layer.update_thread(thread_id, name="long", user_id=user_id)
    start = datetime.now(UTC) - timedelta(hours=1)
    for turn in range(turns):
        ids = [str(uuid.uuid4()) for _ in range(3)]
        for n, (kind, parent) in enumerate(
            [("user_message", None), ("run", ids[0]), ("assistant_message", ids[1])]
        ):
            at = conversations.timestamp(start + timedelta(minutes=turn, seconds=n))
            step = {"id": ids[n], "threadId": thread_id, "parentId": parent, "type": kind, "name": kind,
                    "output": f"turn {turn} {kind}", "createdAt": at, "streaming": False}  # fmt: skip
            await layer.create_step(typing.cast(StepDict, step))
        answers.append(ids[2])
    return thread_id, answers


@pytest.mark.asyncio(loop_scope="module")
async def test_the_length_cap_keeps_each_conversation_s_last_turns(
    history: History, caplog: pytest.LogCaptureFixture
) -> None:
    layer, engine = history.layer, history.engine
    assert layer is not None and engine is not None
    ivan = await new_user(history, "ivan")
    (long_one, answers), (short_one, _) = (
        await new_long_thread(history, ivan, 5),
        await new_long_thread(history, ivan, 2),
    )
    await layer.upsert_feedback(Feedback(forId=answers[0], value=0, comment="old"))
    await layer.upsert_feedback(Feedback(forId=answers[4], value=1, comment="new"))
    async with engine.begin() as connection:  # an element on an old answer
        insert = (
            'INSERT INTO elements ("id", "threadId", "forId", "name") VALUES (:id, :thread, :answer, :name)'
        )
        element = {"id": str(uuid.uuid4()), "thread": long_one, "answer": answers[0], "name": "old.txt"}
        await connection.execute(text(insert), element)
    capped = {"history_max_turns": 2, "history_max_conversations": 0, "history_retention_days": 0}
    history.settings = dataclasses.replace(history.settings, **capped)  # type: ignore[arg-type]
    history._retention_at = None
    with caplog.at_level("INFO"):
        assert await history.retention_round() == 0, "no conversation is deleted"
    assert "trimmed 1 conversation(s) to their last 2 turns" in caplog.text
    thread = await layer.get_thread(long_one)
    assert thread is not None and [s["output"] for s in thread["steps"] if s["type"] == "user_message"] == [
        "turn 3 user_message", "turn 4 user_message"
    ]  # fmt: skip
    assert len(thread["steps"]) == 6, "the last two turns whole: message, run, answer"
    assert await count(history, "feedbacks") == 1 and await count(history, "elements") == 0
    assert await count(history, "steps", '"threadId" = :id', id=short_one) == 6, "a short one is untouched"
    assert await conversations.trim_long_threads(engine, keep=2) == 0, "the cap holds"
