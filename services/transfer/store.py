"""Conversations read for export and written by import, straight from the database.

Reads only ever select rows of the asking person's own conversations (`userIdentifier`). An import
writes in short transactions of BATCH_ROWS rows, pausing after each PAUSE_PER_BATCH times as long as
it took, so it takes at most about a quarter of the database's writes (and of the core the app's
event loop shares with them) however large the file; a failure midway deletes what it stored: all
of a file is stored, or none.
Imported rows get new ids (uuid4) and the import's time as their stored time, so retention counts
an imported conversation as active from its import; the file's times are kept in each message's
metadata and come back in exports. Each imported message is marked imported in its metadata: its
"assistant" messages are the file's words, and a share link must not show them as the app's answers.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from services.chat.commands import is_command
from services.history.conversations import LAST_ACTIVE, delete_threads, timestamp
from services.history.resume import ANSWER_KEY, ANSWER_METADATA, stored_dict
from services.transfer.archive import Conversation, Message

logger = logging.getLogger(__name__)

# Rows (conversations' and messages') per transaction of an import: SQLite lets one writer in at a
# time, so another person's messages wait about one batch at most (tens of milliseconds, the search
# index's triggers included), never the whole import.
BATCH_ROWS = 200
# After each batch, a pause of this many times the batch's own time: on 2 cores the engine's worker
# has one and the app's event loop shares the other with the database's work, so the import's share
# is what everyone else's answers lose.
PAUSE_PER_BATCH = 3.0
MIN_PAUSE_SECONDS = 0.005

IMPORTED_AT_KEY = "created_at"  # the file's time of an imported message, in the step's metadata
IMPORTED_KEY = "imported"  # in every imported message's metadata (and the thread's): not this app's
USER_NAME = "User"  # the author Chainlit's page gives a person's messages

_STEPS = (
    'SELECT "type", "output", "metadata", "createdAt", "input", "showInput" FROM steps '
    "WHERE \"threadId\" = :id AND \"type\" IN ('user_message', 'assistant_message') "
    'ORDER BY "createdAt", "id"'
)
_INSERT_THREAD = (
    'INSERT INTO threads ("id", "createdAt", "name", "userId", "userIdentifier", "tags", "metadata") '
    "VALUES (:id, :at, :name, :user_id, :who, :tags, :metadata)"
)
_INSERT_STEP = (
    'INSERT INTO steps ("id", "name", "type", "threadId", "output", "input", "metadata", "generation", '
    '"createdAt", "start", "end", "streaming", "waitForAnswer", "isError", "showInput") VALUES (:id, '
    ":name, :type, :thread, :output, '', :metadata, '{}', :at, :at, :at, FALSE, FALSE, FALSE, 'false')"
)
_OWNED_IDS = (
    f'SELECT t."id" FROM threads t LEFT JOIN steps s ON s."threadId" = t."id" '
    f'WHERE t."userIdentifier" = :who GROUP BY t."id", t."createdAt" '
    f'ORDER BY {LAST_ACTIVE} DESC, t."id" LIMIT :limit'
)


def _message(
    kind: str, output: str | None, metadata: Any, created_at: str | None, given: Any, shown: Any
) -> Message | None:
    """A stored step as a message of the conversation, or None (commands, notices, errors). Imported:
    marked so, or stored as only an import stores a message (before the mark: input '', showInput
    'false'; Chainlit's messages leave both empty)."""
    body = output or ""
    meta = stored_dict(metadata)
    at = meta.get(IMPORTED_AT_KEY) if isinstance(meta.get(IMPORTED_AT_KEY), str) else created_at
    imported = meta.get(IMPORTED_KEY) is True or (given == "" and shown == "false")
    if kind == "user_message" and body and not is_command(body):
        return Message("user", body, at, imported)
    if kind == "assistant_message" and body and meta.get(ANSWER_KEY):
        return Message("assistant", body, at, imported)
    return None


async def owns(engine: AsyncEngine, thread_id: str, owner: str) -> bool:
    async with engine.connect() as connection:
        row = await connection.execute(
            text('SELECT 1 FROM threads WHERE "id" = :id AND "userIdentifier" = :who'),
            {"id": thread_id, "who": owner},
        )
        return row.first() is not None


async def owned_conversation(engine: AsyncEngine, thread_id: str, owner: str) -> Conversation | None:
    """The conversation `thread_id` if `owner` owns it; None for anyone else's and a missing one alike."""
    async with engine.connect() as connection:
        thread = (
            await connection.execute(
                text('SELECT "name", "createdAt" FROM threads WHERE "id" = :id AND "userIdentifier" = :who'),
                {"id": thread_id, "who": owner},
            )
        ).first()
        if thread is None:
            return None
        rows = (await connection.execute(text(_STEPS), {"id": thread_id})).all()
    messages = [m for row in rows if (m := _message(*row)) is not None]
    return Conversation(thread[0] or "Conversation", thread[1], messages)


async def owned_thread_ids(engine: AsyncEngine, owner: str, limit: int) -> tuple[list[str], int]:
    """The ids of `owner`'s `limit` most recently active conversations, and how many they have."""
    async with engine.connect() as connection:
        ids = [row[0] for row in await connection.execute(text(_OWNED_IDS), {"who": owner, "limit": limit})]
        total = (
            await connection.execute(
                text('SELECT COUNT(*) FROM threads WHERE "userIdentifier" = :who'), {"who": owner}
            )
        ).scalar_one()
    return ids, int(total)


class PartlyStored(RuntimeError):
    """Storing failed midway and what was stored could not be deleted again: these conversations stay."""

    def __init__(self, titles: list[str]) -> None:
        super().__init__(f"{len(titles)} imported conversation(s) stayed after a failure")
        self.titles = titles


@dataclass
class _Batch:
    threads: list[dict[str, str]] = field(default_factory=list)
    steps: list[dict[str, str]] = field(default_factory=list)

    @property
    def rows(self) -> int:
        return len(self.threads) + len(self.steps)


async def import_conversations(
    engine: AsyncEngine, owner: str, conversations: list[Conversation], assistant_name: str
) -> list[str]:
    """Store `conversations` as `owner`'s, BATCH_ROWS rows per transaction, pausing after each
    PAUSE_PER_BATCH times as long as it took; return their new thread ids. A failure (or a cancel)
    midway deletes what was stored; PartlyStored when even that fails."""
    async with engine.connect() as connection:
        user_id = (
            await connection.execute(text('SELECT "id" FROM users WHERE "identifier" = :who'), {"who": owner})
        ).scalar()
    if user_id is None:
        raise LookupError("the importing person has no user row")
    stored: dict[str, str] = {}  # thread id: title, of every batch begun (a cut commit may have landed)
    try:
        for batch in _batches(conversations, owner, str(user_id), assistant_name):
            started = time.monotonic()
            stored.update((row["id"], row["name"]) for row in batch.threads)
            async with engine.begin() as connection:
                if batch.threads:
                    await connection.execute(text(_INSERT_THREAD), batch.threads)
                if batch.steps:
                    await connection.execute(text(_INSERT_STEP), batch.steps)
            await asyncio.sleep(max(MIN_PAUSE_SECONDS, PAUSE_PER_BATCH * (time.monotonic() - started)))
    except BaseException as error:
        await _delete_stored(engine, stored, error)
        raise
    return list(stored)


async def _delete_stored(engine: AsyncEngine, stored: dict[str, str], error: BaseException) -> None:
    """Delete the conversations a failed import stored; PartlyStored (from `error`) when that fails."""
    if not stored:
        return
    try:
        await asyncio.shield(delete_threads(engine, list(stored)))
    except Exception as cleanup_error:
        logger.error("an import failed and left %d conversation(s): %r", len(stored), cleanup_error)
        if isinstance(error, Exception):
            raise PartlyStored(list(stored.values())) from error


def _batches(
    conversations: list[Conversation], owner: str, user_id: str, assistant_name: str
) -> Iterator[_Batch]:
    """The rows of `conversations`, at most BATCH_ROWS at a time (a conversation's row before its
    messages'), each conversation's times a millisecond apart from the import's, in order."""
    now = datetime.now(UTC)
    batch = _Batch()
    for conversation in conversations:
        thread_id = str(uuid.uuid4())
        batch.threads.append(_thread_row(conversation, thread_id, owner, user_id, now))
        for row in _step_rows(conversation, thread_id, now, assistant_name):
            if batch.rows >= BATCH_ROWS:
                yield batch
                batch = _Batch()
            batch.steps.append(row)
        now += timedelta(milliseconds=len(conversation.messages) + 1)
    if batch.rows:
        yield batch


def _thread_row(
    conversation: Conversation, thread_id: str, owner: str, user_id: str, now: datetime
) -> dict[str, str]:
    return {
        "id": thread_id,
        "at": timestamp(now),
        "name": conversation.title,
        "user_id": user_id,
        "who": owner,
        "tags": "[]",
        "metadata": json.dumps({IMPORTED_KEY: True}),
    }


def _step_rows(
    conversation: Conversation, thread_id: str, now: datetime, assistant_name: str
) -> Iterator[dict[str, str]]:
    """The steps of an imported conversation, a millisecond apart from `now`, in order."""
    for index, message in enumerate(conversation.messages):
        at = timestamp(now + timedelta(milliseconds=index))
        metadata = {**(ANSWER_METADATA if message.role == "assistant" else {}), IMPORTED_KEY: True}
        if message.created_at:
            metadata[IMPORTED_AT_KEY] = message.created_at
        yield {
            "id": str(uuid.uuid4()),
            "thread": thread_id,
            "output": message.content,
            "at": at,
            "type": f"{message.role}_message",
            "metadata": json.dumps(metadata),
            "name": USER_NAME if message.role == "user" else assistant_name,
        }
