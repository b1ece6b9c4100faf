"""The search index of migration 14 on real SQLite and PostgreSQL: a database searched before it is
upgraded in place, both ways PostgreSQL reads a person's messages (a word in most of their newest
messages: newest first; a rarer one: the GIN index) find what they should and only the person's,
and the owner kept in the index follows a conversation given to someone else."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from chainlit.context import init_http_context
from sqlalchemy import text

from harness.postgres import PostgresCluster
from services.config import Settings
from services.history import conversations, migrations, thread_search
from services.history.database import create_engine
from services.history.service import History
from services.history.thread_search import DENSE_OF_SAMPLE, owner_lexeme, owner_token
from tests.system.history.conftest import START, conversation, found, people

in_loop = pytest.mark.asyncio(loop_scope="module")
UPGRADE = 14
USER = 'INSERT INTO users ("id", "identifier", "metadata", "createdAt") VALUES (:u, :n, \'{}\', :at)'
THREAD = 'INSERT INTO threads ("id", "createdAt", "name", "userId") VALUES (:t, :at, :n, :u)'
STEP = (
    'INSERT INTO steps ("id", "name", "type", "threadId", "output", "createdAt") '
    "VALUES (:id, 'User', :type, :t, :out, :at)"
)


@pytest.fixture(params=["sqlite", "postgresql"])
def environ(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, str]:
    environ = {"DATA_DIR": str(tmp_path)}
    if request.param == "postgresql":
        cluster: PostgresCluster = request.getfixturevalue("postgres")
        environ["DATABASE_URL"] = cluster.create_database(f"u{uuid.uuid4().hex[:12]}")
    return environ


@pytest_asyncio.fixture(loop_scope="module")
async def history(environ: dict[str, str]) -> AsyncIterator[History]:
    history = History(Settings.from_env(environ), keep_conversations=True, use_database=True)
    await history.start()
    init_http_context()
    yield history
    await history.stop()


async def stored_before_upgrade(settings: Settings, owners: list[str]) -> dict[str, str]:
    """A database of every migration but UPGRADE, with people and a conversation each written straight
    into the tables (as an older app stored them): {owner: thread id}."""
    engine = create_engine(settings)
    every = migrations.MIGRATIONS
    migrations.MIGRATIONS = tuple(m for m in every if m.version != UPGRADE)
    threads = {}
    try:
        await migrations.migrate(engine)
        async with engine.begin() as connection:
            for i, owner in enumerate(owners):
                user_id, thread_id = str(uuid.uuid4()), str(uuid.uuid4())
                at = conversations.timestamp(START)
                await connection.execute(text(USER), {"u": user_id, "n": owner, "at": at})
                await connection.execute(
                    text(THREAD), {"t": thread_id, "at": at, "n": f"Notes {i}", "u": user_id}
                )
                for j, words in enumerate(["the old almanac", f"padlock {owner} harbour"]):
                    kind = ("user_message", "assistant_message")[j]
                    await connection.execute(
                        text(STEP),
                        {"id": str(uuid.uuid4()), "type": kind, "t": thread_id, "out": words, "at": at},
                    )
                threads[user_id] = thread_id
    finally:
        migrations.MIGRATIONS = every
        await engine.dispose()
    return threads


@in_loop
async def test_a_searched_database_is_upgraded_in_place_and_finds_the_same(environ: dict[str, str]) -> None:
    settings = Settings.from_env(environ)
    threads = await stored_before_upgrade(settings, ["old-alice", "old-bob"])
    history = History(settings, keep_conversations=True, use_database=True)
    await history.start()  # applies UPGRADE over the stored conversations
    init_http_context()
    try:
        engine = history.engine
        assert engine is not None
        async with engine.connect() as connection:
            done = (await connection.execute(text("SELECT MAX(version) FROM schema_migrations"))).scalar()
        assert done == migrations.LATEST_VERSION
        for user_id, thread_id in threads.items():
            assert await found(history, user_id, "almanac") == [thread_id], "found by its owner only"
            assert await found(history, user_id, "pa") == [thread_id], "a 2-letter prefix"
            assert await found(history, user_id, "harbour old") == [thread_id], "words of one message"
        alice, bob = threads
        assert await found(history, alice, "old bob") == [], "the other's word is in the other's message"
        async with engine.begin() as connection:
            await connection.execute(text("DELETE FROM schema_migrations WHERE version = :v"), {"v": UPGRADE})
        assert await migrations.migrate(engine) == [UPGRADE], "it can run again"
        assert await found(history, bob, "padl") == [threads[bob]]
    finally:
        await history.stop()


@in_loop
async def test_a_word_in_most_messages_and_a_rare_one_find_only_the_persons_newest(history: History) -> None:
    alice, bob = await people(history)
    busy = DENSE_OF_SAMPLE * 3  # messages holding "forecast": most of Alice's newest
    old = await conversation(history, alice, "Old", ["forecast archipelago"], minutes=0)
    chatty = await conversation(history, alice, "Chatty", [f"forecast number {i}" for i in range(busy)], 10)
    rare = await conversation(history, alice, "Rare", ["an archipelago"], minutes=20)
    bobs = await conversation(history, bob, "Bob", ["forecast archipelago"] * 3, minutes=30)
    assert set(await found(history, alice, "forecast")) == {old, chatty}, "newest first, then older"
    assert set(await found(history, alice, "archipelago")) == {old, rare}, "the GIN index's way"
    assert set(await found(history, alice, "forecast archipelago")) == {old}
    assert await found(history, bob, "forecast") == [bobs] and await found(history, bob, "number") == []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(thread_search, "THREAD_SEARCH_MAX_MATCHES", busy // 2)
        assert await found(history, alice, "forecast") == [chatty], "only the newest matches are ranked"
        assert set(await found(history, alice, "archipelago")) == {old, rare}


@in_loop
async def test_a_conversation_given_to_someone_else_is_found_by_them_only(history: History) -> None:
    alice, bob = await people(history)
    words = [f"lighthouse keeper {i}" for i in range(DENSE_OF_SAMPLE + 5)]
    thread_id = await conversation(history, alice, "Coast", words)
    assert await found(history, alice, "lighthouse") == [thread_id] and await found(history, bob, "lig") == []
    assert history.layer is not None
    await history.layer.update_thread(thread_id, user_id=bob)
    for search in ("lighthouse", "lig", "keeper 3", "coast"):
        assert await found(history, bob, search) == [thread_id], search
        assert await found(history, alice, search) == [], search
    for user in (alice, bob):
        assert await found(history, alice, owner_lexeme(user)) == [], "the owner is no word to search"
        assert await found(history, alice, owner_token(user)) == []
