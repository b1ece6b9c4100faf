"""Share links: a read-only snapshot of one conversation, copied when the link is made, behind a
random token of 256 bits of which only the sha256 is stored.

The snapshot holds the conversation's title and its messages (role, text, time, and whether it was
imported: the page marks those, an imported "assistant" message being the file's words, not the
app's answer): no id, user name, e-mail, metadata or document text. A link works until its owner
revokes it or SHARE_TTL_DAYS pass; an unknown, revoked and expired token are answered alike.
Deleting the conversation deletes its links (services/history/conversations.py, data_layer.py);
expired links are deleted when the next link is made.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from services.history.conversations import timestamp
from services.history.resume import stored_dict
from services.transfer.archive import Conversation, Message
from services.transfer.store import IMPORTED_KEY, owned_conversation

TOKEN_BYTES = 32  # 256 bits from the operating system's generator
MAX_TOKEN_CHARS = 100  # a longer path segment is not a token of ours: not even hashed


@dataclass(frozen=True)
class NewShare:
    token: str  # shown once, to the owner; only its hash is stored
    expires_at: str


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def snapshot_json(conversation: Conversation) -> str:
    rows = [[m.role, m.content, m.created_at, m.imported] for m in conversation.messages]
    return json.dumps(rows, ensure_ascii=False)


def snapshot_messages(snapshot: str, thread_metadata: Any) -> list[Message]:
    """A snapshot's messages. One made before imported messages were marked has three fields each:
    when its conversation was imported, every message counts as imported (the safe reading)."""
    imported_thread = stored_dict(thread_metadata).get(IMPORTED_KEY) is True
    return [
        Message(role, content, at, bool(marked[0]) if marked else imported_thread)
        for role, content, at, *marked in json.loads(snapshot)
    ]


async def create_share(engine: AsyncEngine, thread_id: str, owner: str, ttl_days: float) -> NewShare | None:
    """A new link to a snapshot of `owner`'s conversation; None when it is not theirs (or missing)."""
    conversation = await owned_conversation(engine, thread_id, owner)
    if conversation is None:
        return None
    token = secrets.token_urlsafe(TOKEN_BYTES)
    now = datetime.now(UTC)
    expires_at = timestamp(now + timedelta(days=ttl_days))
    async with engine.begin() as connection:
        await connection.execute(text("DELETE FROM shares WHERE expires_at < :now"), {"now": timestamp(now)})
        await connection.execute(
            text(
                "INSERT INTO shares (id, token_hash, thread_id, owner, title, snapshot, created_at, "
                "expires_at) VALUES (:id, :hash, :thread, :owner, :title, :snapshot, :now, :expires)"
            ),
            {
                "id": str(uuid.uuid4()),
                "hash": token_hash(token),
                "thread": thread_id,
                "owner": owner,
                "title": conversation.title,
                "snapshot": snapshot_json(conversation),
                "now": timestamp(now),
                "expires": expires_at,
            },
        )
    return NewShare(token, expires_at)


async def shared_conversation(engine: AsyncEngine, token: str) -> Conversation | None:
    """The snapshot behind a live link; None for an unknown, revoked or expired one."""
    if not token or len(token) > MAX_TOKEN_CHARS:
        return None
    async with engine.connect() as connection:
        row = (
            await connection.execute(
                text(
                    'SELECT s.title, s.snapshot, t."metadata" FROM shares s LEFT JOIN threads t '
                    'ON t."id" = s.thread_id WHERE s.token_hash = :hash AND s.revoked_at IS NULL '
                    "AND s.expires_at > :now"
                ),
                {"hash": token_hash(token), "now": timestamp(datetime.now(UTC))},
            )
        ).first()
    if row is None:
        return None
    return Conversation(row[0], None, snapshot_messages(row[1], row[2]))


async def revoke_shares(engine: AsyncEngine, thread_id: str, owner: str) -> int:
    """End every live link to `owner`'s conversation `thread_id`; return how many (expired ones
    are over already and not counted)."""
    async with engine.begin() as connection:
        result = await connection.execute(
            text(
                "UPDATE shares SET revoked_at = :now WHERE thread_id = :thread AND owner = :owner "
                "AND revoked_at IS NULL AND expires_at > :now"
            ),
            {"now": timestamp(datetime.now(UTC)), "thread": thread_id, "owner": owner},
        )
    return int(result.rowcount or 0)
