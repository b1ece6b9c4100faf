"""Conversations read for export and written by import, straight from the database.

Reads only ever select rows of the asking person's own conversations (`userIdentifier`), and an
import writes every row of every conversation in one transaction: all of them are stored, or none.
Imported rows get new ids (uuid4) and the import's time as their stored time, so retention counts
an imported conversation as active from its import; the file's times are kept in each message's
metadata and come back in exports. Each imported message is marked imported in its metadata: its
"assistant" messages are the file's words, and a share link must not show them as the app's answers.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from services.history.conversations import LAST_ACTIVE, timestamp
from services.history.resume import ANSWER_KEY, ANSWER_METADATA, is_command, stored_dict
from services.transfer.archive import Conversation, Message

IMPORTED_AT_KEY = "created_at"  # the file's time of an imported message, in the step's metadata
IMPORTED_KEY = "imported"  # in every imported message's metadata (and the thread's): not this app's
USER_NAME = "User"  # the author Chainlit's page gives a person's messages

_STEPS = (
    'SELECT "type", "output", "metadata", "createdAt", "input", "showInput" FROM steps '
    "WHERE \"threadId\" = :id AND \"type\" IN ('user_message', 'assistant_message') "
    'ORDER BY "createdAt", "id"'
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


async def import_conversations(
    engine: AsyncEngine, owner: str, conversations: list[Conversation], assistant_name: str
) -> list[str]:
    """Store `conversations` as `owner`'s, in one transaction; return their new thread ids."""
    now = datetime.now(UTC)
    async with engine.begin() as connection:
        user_id = (
            await connection.execute(text('SELECT "id" FROM users WHERE "identifier" = :who'), {"who": owner})
        ).scalar()
        if user_id is None:
            raise LookupError("the importing person has no user row")
        ids = []
        for conversation in conversations:
            ids.append(await _insert(connection, conversation, owner, user_id, now, assistant_name))
            now += timedelta(milliseconds=len(conversation.messages) + 1)
    return ids


async def _insert(
    connection: AsyncConnection,
    conversation: Conversation,
    owner: str,
    user_id: str,
    now: datetime,
    assistant_name: str,
) -> str:
    thread_id = str(uuid.uuid4())
    await connection.execute(
        text(
            'INSERT INTO threads ("id", "createdAt", "name", "userId", "userIdentifier", "tags", "metadata") '
            "VALUES (:id, :at, :name, :user_id, :who, :tags, :metadata)"
        ),
        {
            "id": thread_id,
            "at": timestamp(now),
            "name": conversation.title,
            "user_id": user_id,
            "who": owner,
            "tags": "[]",
            "metadata": json.dumps({IMPORTED_KEY: True}),
        },
    )
    rows = _step_rows(conversation, thread_id, now, assistant_name)
    if rows:
        await connection.execute(
            text(
                'INSERT INTO steps ("id", "name", "type", "threadId", "output", "input", "metadata", '
                '"generation", "createdAt", "start", "end", "streaming", "waitForAnswer", "isError", '
                "\"showInput\") VALUES (:id, :name, :type, :thread, :output, '', :metadata, '{}', "
                ":at, :at, :at, FALSE, FALSE, FALSE, 'false')"
            ),
            rows,
        )
    return thread_id


def _step_rows(
    conversation: Conversation, thread_id: str, now: datetime, assistant_name: str
) -> list[dict[str, str]]:
    """The steps of an imported conversation, a millisecond apart from `now`, in order."""
    rows = []
    for index, message in enumerate(conversation.messages):
        at = timestamp(now + timedelta(milliseconds=index))
        metadata = {**(ANSWER_METADATA if message.role == "assistant" else {}), IMPORTED_KEY: True}
        if message.created_at:
            metadata[IMPORTED_AT_KEY] = message.created_at
        rows.append(
            {
                "id": str(uuid.uuid4()),
                "thread": thread_id,
                "output": message.content,
                "at": at,
                "type": f"{message.role}_message",
                "metadata": json.dumps(metadata),
                "name": USER_NAME if message.role == "user" else assistant_name,
            }
        )
    return rows
