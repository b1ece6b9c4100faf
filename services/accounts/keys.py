"""API keys: each belongs to one account, is shown once, and is stored only as its sha256.

A key is `sk-vc-` and 43 URL-safe characters (256 random bits), so a plain sha256 is enough to store
it (no salt or slow hash is needed against guessing a 256-bit secret). People see and revoke keys by
their prefix (the first 12 characters). A key works while it is not revoked and its account is not
removed; removing an account revokes its keys.
"""

from __future__ import annotations

import hashlib
import secrets
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from services.accounts.store import AccountError, normalize_username
from services.history import conversations

KEY_MARK = "sk-vc-"
PREFIX_CHARS = 12  # what listings show: the mark and 6 random characters
LAST_USED_EVERY = timedelta(minutes=1)  # last_used_at is written at most this often per key


@dataclass(frozen=True)
class ApiKey:
    """What may be shown of a key (never the key itself)."""

    prefix: str
    user: str
    created_at: str
    last_used_at: str | None
    revoked_at: str | None


@dataclass(frozen=True)
class KeyHolder:
    """Who a presented key belongs to."""

    user: str
    role: str
    prefix: str


def key_hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def new_key() -> str:
    return KEY_MARK + secrets.token_urlsafe(32)


def _now() -> str:
    return conversations.timestamp(datetime.now(UTC))


class ApiKeyStore:
    """Creates, lists, revokes and checks keys; every method is one short transaction."""

    def __init__(self, engine: AsyncEngine, keys_per_user: int) -> None:
        self.engine = engine
        self.keys_per_user = keys_per_user

    async def create(self, username: str) -> str:
        """A new key for an existing account; returned once, stored hashed."""
        user = await self._active_user(normalize_username(username))
        if len(await self.list(user)) >= self.keys_per_user:
            raise AccountError(f"{user} already has {self.keys_per_user} keys (the limit); revoke one first")
        key = new_key()
        async with self.engine.begin() as connection:
            await connection.execute(
                text(
                    "INSERT INTO api_keys (id, user_identifier, prefix, key_hash, created_at) "
                    "VALUES (:id, :user, :prefix, :hash, :now)"
                ),
                {"id": str(uuid.uuid4()), "user": user, "prefix": key[:PREFIX_CHARS], "hash": key_hash(key)}
                | {"now": _now()},
            )
        return key

    async def list(self, username: str | None = None, include_revoked: bool = False) -> list[ApiKey]:
        """Keys of one account (or all), oldest first."""
        query = "SELECT prefix, user_identifier, created_at, last_used_at, revoked_at FROM api_keys"
        conditions = []
        values = {}
        if username is not None:
            conditions.append("user_identifier = :user")
            values["user"] = normalize_username(username)
        if not include_revoked:
            conditions.append("revoked_at IS NULL")
        if conditions:
            query += " WHERE " + " AND ".join(conditions)
        async with self.engine.connect() as connection:
            rows = await connection.execute(text(query + " ORDER BY created_at, prefix"), values)
            return [ApiKey(*row) for row in rows]

    async def revoke(self, username: str | None, prefix: str) -> int:
        """Revoke the key shown with `prefix` (or given whole), of `username` when given; return how many."""
        prefix = prefix.strip()[:PREFIX_CHARS]
        if len(prefix) < PREFIX_CHARS or not prefix.startswith(KEY_MARK):
            raise AccountError(f"give a key's prefix as listed (like {KEY_MARK}AbCdEf)")
        query = "UPDATE api_keys SET revoked_at = :now WHERE revoked_at IS NULL AND prefix = :prefix"
        values = {"now": _now(), "prefix": prefix}
        if username is not None:
            query += " AND user_identifier = :user"
            values["user"] = normalize_username(username)
        async with self.engine.begin() as connection:
            result = await connection.execute(text(query), values)
        return result.rowcount or 0

    async def revoke_all(self, username: str) -> int:
        async with self.engine.begin() as connection:
            result = await connection.execute(
                text(
                    "UPDATE api_keys SET revoked_at = :now WHERE revoked_at IS NULL AND user_identifier = :u"
                ),
                {"now": _now(), "u": normalize_username(username)},
            )
        return result.rowcount or 0

    async def holder(self, key: str) -> KeyHolder | None:
        """The active account a presented key belongs to; None for an unknown, revoked or orphaned key."""
        if not key.startswith(KEY_MARK):
            return None
        async with self.engine.connect() as connection:
            row = (
                await connection.execute(
                    text(
                        "SELECT k.id, k.user_identifier, u.role, k.prefix, k.last_used_at FROM api_keys k "
                        "JOIN users u ON u.identifier = k.user_identifier WHERE k.key_hash = :hash "
                        "AND k.revoked_at IS NULL AND (u.disabled IS NULL OR u.disabled = FALSE)"
                    ),
                    {"hash": key_hash(key)},
                )
            ).first()
        if row is None:
            return None
        now = datetime.now(UTC)
        if row[4] is None or row[4] < conversations.timestamp(now - LAST_USED_EVERY):
            async with self.engine.begin() as connection:
                await connection.execute(
                    text("UPDATE api_keys SET last_used_at = :now WHERE id = :id"),
                    {"now": conversations.timestamp(now), "id": row[0]},
                )
        return KeyHolder(user=row[1], role=row[2] or "user", prefix=row[3])

    async def _active_user(self, identifier: str) -> str:
        async with self.engine.connect() as connection:
            row = (
                await connection.execute(
                    text("SELECT disabled FROM users WHERE identifier = :who"), {"who": identifier}
                )
            ).first()
        if row is None or row[0]:
            raise AccountError(f"no account named {identifier}")
        return identifier
