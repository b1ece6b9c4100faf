"""Import and share links on both databases (SQLite and a real PostgreSQL): an import is stored in
short transactions (a failure midway leaves nothing), imported rows get new ids and belong to the importer
only, and a share stores the token's hash and a snapshot, and ends when revoked, expired or deleted."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import pytest_asyncio
from chainlit.context import init_http_context
from chainlit.user import User
from sqlalchemy import text

from harness.postgres import PostgresCluster
from services.config import Settings
from services.history.conversations import delete_threads
from services.history.service import History
from services.transfer import store
from services.transfer.archive import Conversation, Message, archive_text
from services.transfer.service import Transfers

in_loop = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(params=["sqlite", "postgresql"], loop_scope="module")
async def history(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[History]:
    environ = {"DATA_DIR": str(tmp_path), "DATABASE_TIMEOUT_SECONDS": "2"}
    if request.param == "postgresql":
        cluster: PostgresCluster = request.getfixturevalue("postgres")
        environ["DATABASE_URL"] = cluster.create_database(f"t{uuid.uuid4().hex[:12]}")
    history = History(Settings.from_env(environ), keep_conversations=True, use_database=True)
    await history.start()
    init_http_context()
    assert history.layer is not None
    for name in ("alice", "bob"):
        await history.layer.create_user(User(identifier=name, metadata={"role": "user"}))
    yield history
    await history.stop()


async def rows(history: History, table: str) -> int:
    assert history.engine is not None
    async with history.engine.connect() as connection:
        return (await connection.execute(text(f"SELECT COUNT(*) FROM {table}"))).scalar_one()


def archive(count: int) -> bytes:
    conversations = [
        Conversation(
            f"talk {n}", None, [Message("user", f"question {n}"), Message("assistant", f"answer {n}")]
        )
        for n in range(count)
    ]
    return archive_text(conversations, datetime.now(UTC)).encode()


@in_loop
async def test_an_import_that_fails_midway_stores_nothing(history: History, monkeypatch) -> None:
    """An import is stored in short transactions: a failure midway deletes the batches stored before."""
    transfers = Transfers(history.engine, history.settings)  # type: ignore[arg-type]
    batches, calls = store._batches, []
    monkeypatch.setattr(store, "BATCH_ROWS", 3)  # 4 conversations of 2 messages: 12 rows, 4 batches

    def fail_on_the_third(*args):  # the database refusing the third batch
        for batch in batches(*args):
            calls.append(1)
            if len(calls) == 3:
                raise RuntimeError("disk full")
            yield batch

    monkeypatch.setattr(store, "_batches", fail_on_the_third)
    with pytest.raises(RuntimeError, match="disk full"):
        await transfers.import_file("alice", archive(4), "Assistant")
    assert (await rows(history, "threads"), await rows(history, "steps")) == (0, 0), "nothing half-imported"
    monkeypatch.setattr(store, "_batches", batches)
    imported = await transfers.import_file("alice", archive(4), "Assistant")
    assert (await rows(history, "threads"), await rows(history, "steps")) == (4, 8)
    assert len(set(imported.thread_ids)) == 4
    conversation = await store.owned_conversation(history.engine, imported.thread_ids[0], "alice")  # type: ignore[arg-type]
    assert conversation is not None and [m.content for m in conversation.messages] == [
        "question 0",
        "answer 0",
    ]
    assert await store.owned_conversation(history.engine, imported.thread_ids[0], "bob") is None  # type: ignore[arg-type]


@in_loop
async def test_a_share_stores_a_hash_and_a_snapshot_and_ends(history: History) -> None:
    transfers = Transfers(history.engine, history.settings)  # type: ignore[arg-type]
    [thread_id] = (await transfers.import_file("alice", archive(1), "Assistant")).thread_ids
    assert await transfers.share(thread_id, "bob") is None, "only the owner shares"
    first, second = await transfers.share(thread_id, "alice"), await transfers.share(thread_id, "alice")
    assert first is not None and second is not None
    assert history.engine is not None
    async with history.engine.connect() as connection:
        stored = (await connection.execute(text("SELECT token_hash, snapshot, owner FROM shares"))).all()
    assert {row[0] for row in stored} == {
        hashlib.sha256(t.encode()).hexdigest() for t in (first.token, second.token)
    }
    assert all(first.token not in row[1] and second.token not in row[1] for row in stored)
    shown = await transfers.shared(first.token)
    assert shown is not None and [m.content for m in shown.messages] == ["question 0", "answer 0"]
    assert (
        await transfers.revoke(thread_id, "bob") is None and await transfers.shared(first.token) is not None
    )
    async with history.engine.begin() as connection:
        expire = text("UPDATE shares SET expires_at = '2000-01-01T00:00:00Z' WHERE token_hash = :h")
        await connection.execute(expire, {"h": hashlib.sha256(second.token.encode()).hexdigest()})
    assert await transfers.shared(second.token) is None, "expired"
    assert await transfers.revoke(thread_id, "alice") == 1
    assert await transfers.shared(first.token) is None, "revoked"
    third = await transfers.share(thread_id, "alice")
    assert third is not None and await rows(history, "shares") == 2, "the expired one was cleaned up"
    await delete_threads(history.engine, [thread_id])
    assert await rows(history, "shares") == 0 and await transfers.shared(third.token) is None
