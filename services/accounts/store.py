"""Accounts in the database: rows of Chainlit's `users` table with a password hash, a role, a disabled
flag and a session generation.

Removing an account deletes its conversations and disables the row instead of deleting it:
Chainlit re-creates a missing user row whenever a still-valid sign-in cookie is presented, and a
disabled row is what lets the app refuse that cookie. A name given back gets a new row id and starts
with no conversation: none of the removed owner's, even one a write under way stored late. Every
change that should sign the account out everywhere (a new password, a new role, removal, being
given back, signing out) moves its session generation, which every sign-in cookie carries
(services/accounts/sessions.py).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from services.accounts.names import AccountError, normalize_username, parse_identity
from services.accounts.passwords import hash_password_async, needs_rehash, password_problem
from services.history import conversations

ROLES = ("admin", "user")


@dataclass(frozen=True)
class Account:
    identifier: str
    role: str
    disabled: bool
    password_hash: str | None
    created_at: str | None
    generation: int = 0  # of its sign-ins: a cookie made under another one is refused

    @property
    def has_password(self) -> bool:
        return bool(self.password_hash)


def _check_role(role: str) -> str:
    if role not in ROLES:
        raise AccountError(f"role {role!r} is not one of {', '.join(ROLES)}")
    return role


def _check_new_password(identifier: str, password: str | None) -> None:
    """A provider identity signs in through its provider; any other password must be acceptable."""
    if password is not None and ":" in identifier:
        raise AccountError(
            f"{identifier} is a provider identity (provider:name): it signs in through its provider. "
            "Add it with --no-password, or link it to an account"
        )
    if password is not None and (problem := password_problem(password)):
        raise AccountError(problem)


def _now() -> str:
    return conversations.timestamp(datetime.now(UTC))


NEXT_GENERATION = "session_generation = COALESCE(session_generation, 0) + 1"  # ends every sign-in


class AccountStore:
    """Reads and changes accounts; every method is one short transaction."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    async def get(self, identifier: str) -> Account | None:
        async with self.engine.connect() as connection:
            row = (
                await connection.execute(
                    text(
                        'SELECT identifier, role, disabled, password_hash, "createdAt", '
                        "COALESCE(session_generation, 0) FROM users WHERE identifier = :who"
                    ),
                    {"who": identifier},
                )
            ).first()
        if row is None:
            return None
        return Account(row[0], row[1] or "user", bool(row[2]), row[3], row[4], int(row[5]))

    async def add(self, username: str, password: str | None, role: str = "user") -> Account:
        """Create an account (or give a removed one back); no password = header or OAuth sign-in only."""
        identifier = normalize_username(username)
        _check_role(role)
        _check_new_password(identifier, password)
        existing = await self.get(identifier)
        if existing is not None and not existing.disabled:
            raise AccountError(f"{identifier} already exists (use reset-password or set-role)")
        if existing is not None:  # given back: nothing of the removed owner's goes to the new one
            await self._delete_conversations(identifier, await self._row_id(identifier))
        password_hash = await hash_password_async(password) if password is not None else None
        values = {
            "who": identifier,
            "hash": password_hash,
            "role": role,
            "meta": json.dumps({"role": role}),
            "now": _now(),
            "id": str(uuid.uuid4()),
        }
        async with self.engine.begin() as connection:
            if existing is None:
                statement = (
                    'INSERT INTO users ("id", identifier, metadata, "createdAt", password_hash, role, '
                    "disabled, updated_at) VALUES (:id, :who, :meta, :now, :hash, :role, FALSE, :now)"
                )
            else:
                statement = (  # given back: the old owner's cookies stay refused, a new row id
                    'UPDATE users SET "id" = :id, password_hash = :hash, role = :role, metadata = :meta, '
                    f"disabled = FALSE, {NEXT_GENERATION}, updated_at = :now WHERE identifier = :who"
                )
            try:
                await connection.execute(text(statement), values)
            except IntegrityError:
                raise AccountError(f"{identifier} already exists") from None
        account = await self.get(identifier)
        assert account is not None
        return account

    async def list(self, include_removed: bool = False) -> list[tuple[Account, int]]:
        """Accounts with their number of conversations, by name."""
        async with self.engine.connect() as connection:
            rows = await connection.execute(
                text(
                    'SELECT u.identifier, u.role, u.disabled, u.password_hash, u."createdAt", COUNT(t."id") '
                    'FROM users u LEFT JOIN threads t ON t."userIdentifier" = u.identifier '
                    'GROUP BY u.identifier, u.role, u.disabled, u.password_hash, u."createdAt" '
                    "ORDER BY u.identifier"
                )
            )
            accounts = [(Account(r[0], r[1] or "user", bool(r[2]), r[3], r[4]), int(r[5])) for r in rows]
        return [(a, n) for a, n in accounts if include_removed or not a.disabled]

    async def remove(self, username: str) -> int:
        """Disable the account, drop its password, revoke its API keys, delete its conversations; return how
        many conversations were deleted."""
        identifier = await self._existing(username)
        if await self._is_last_admin(identifier):
            raise AccountError(f"{identifier} is the last administrator; make someone else admin first")
        async with self.engine.begin() as connection:
            await connection.execute(
                text(
                    f"UPDATE users SET disabled = TRUE, password_hash = NULL, {NEXT_GENERATION}, "
                    "updated_at = :now WHERE identifier = :who"
                ),
                {"who": identifier, "now": _now()},
            )
            await connection.execute(  # its API keys too (they already stop working with the account)
                text(
                    "UPDATE api_keys SET revoked_at = :now "
                    "WHERE user_identifier = :who AND revoked_at IS NULL"
                ),
                {"who": identifier, "now": _now()},
            )
            for table in ("user_presets", "prompt_templates"):  # their presets (services/presets)
                await connection.execute(
                    text(f"DELETE FROM {table} WHERE user_identifier = :who"), {"who": identifier}
                )
        return await self._delete_conversations(identifier, await self._row_id(identifier))

    async def _row_id(self, identifier: str) -> str | None:
        """The account's row id, which Chainlit stores as a conversation's `userId`."""
        async with self.engine.connect() as connection:
            query = text('SELECT "id" FROM users WHERE identifier = :who')
            return (await connection.execute(query, {"who": identifier})).scalar()

    async def _delete_conversations(self, identifier: str, row_id: str | None) -> int:
        """Delete every conversation stored under the account's name or its row id (after the row is
        disabled, no write of the account's can add one: services/history/owned_writes.py)."""
        ids = await conversations.thread_ids_of_user(self.engine, identifier, row_id)
        return await conversations.delete_threads(self.engine, ids)

    async def reset_password(self, username: str, password: str) -> None:
        identifier = await self._existing(username)
        if problem := password_problem(password):
            raise AccountError(problem)
        await self._set_password_hash(identifier, await hash_password_async(password), end_sessions=True)

    async def set_role(self, username: str, role: str) -> None:
        identifier = await self._existing(username)
        _check_role(role)
        if role != "admin" and await self._is_last_admin(identifier):
            raise AccountError(f"{identifier} is the last administrator; make someone else admin first")
        async with self.engine.begin() as connection:
            await connection.execute(
                text(
                    f"UPDATE users SET role = :role, metadata = :meta, {NEXT_GENERATION}, "
                    "updated_at = :now WHERE identifier = :who"
                ),
                {"who": identifier, "role": role, "meta": json.dumps({"role": role}), "now": _now()},
            )

    async def end_sessions(self, identifier: str) -> int | None:
        """Sign the account out everywhere; its new session generation (None: no such row)."""
        async with self.engine.begin() as connection:
            await connection.execute(
                text(f"UPDATE users SET {NEXT_GENERATION}, updated_at = :now WHERE identifier = :who"),
                {"who": identifier, "now": _now()},
            )
            row = (
                await connection.execute(
                    text("SELECT COALESCE(session_generation, 0) FROM users WHERE identifier = :who"),
                    {"who": identifier},
                )
            ).first()
        return int(row[0]) if row is not None else None

    async def rehash_if_needed(self, account: Account, password: str) -> None:
        """After a good sign-in: upgrade a hash made with older parameters."""
        if account.password_hash and needs_rehash(account.password_hash):
            await self._set_password_hash(account.identifier, await hash_password_async(password))

    async def link(self, username: str, identity: str) -> str:
        """Let a provider identity sign in as this account (an administrator's decision); return the
        identity as stored."""
        account = await self._existing(username)
        identity = parse_identity(identity)
        async with self.engine.begin() as connection:
            if (linked := await self._linked(connection, identity)) is not None:
                raise AccountError(f"{identity} is already linked to {linked} (unlink it first)")
            await connection.execute(
                text("INSERT INTO identity_links (identity, account, created_at) VALUES (:id, :who, :now)"),
                {"id": identity, "who": account, "now": _now()},
            )
        return identity

    async def unlink(self, identity: str) -> str:
        """Stop a provider identity signing in as its linked account; return the identity."""
        identity = parse_identity(identity)
        async with self.engine.begin() as connection:
            result = await connection.execute(
                text("DELETE FROM identity_links WHERE identity = :id"), {"id": identity}
            )
        if not result.rowcount:
            raise AccountError(f"{identity} is not linked to any account")
        return identity

    async def links(self) -> list[tuple[str, str, str]]:
        """(identity, account, linked at) of every link, by account."""
        async with self.engine.connect() as connection:
            rows = await connection.execute(
                text("SELECT identity, account, created_at FROM identity_links ORDER BY account, identity")
            )
            return [(row[0], row[1], row[2]) for row in rows]

    async def linked_account(self, identity: str) -> str | None:
        """The account an administrator linked this provider identity to, if any."""
        async with self.engine.connect() as connection:
            return await self._linked(connection, identity)

    @staticmethod
    async def _linked(connection: AsyncConnection, identity: str) -> str | None:
        row = (
            await connection.execute(
                text("SELECT account FROM identity_links WHERE identity = :id"), {"id": identity}
            )
        ).first()
        return row[0] if row is not None else None

    async def admins(self) -> list[str]:
        async with self.engine.connect() as connection:
            rows = await connection.execute(
                text(
                    "SELECT identifier FROM users "
                    "WHERE role = 'admin' AND (disabled IS NULL OR disabled = FALSE)"
                )
            )
            return [row[0] for row in rows]

    async def _is_last_admin(self, identifier: str) -> bool:
        return await self.admins() == [identifier]

    async def _existing(self, username: str) -> str:
        identifier = normalize_username(username)
        account = await self.get(identifier)
        if account is None or account.disabled:
            raise AccountError(f"no account named {identifier}")
        return identifier

    async def _set_password_hash(
        self, identifier: str, password_hash: str, end_sessions: bool = False
    ) -> None:
        """A new hash; `end_sessions` for a new password (an upgraded hash of the same one keeps them)."""
        ending = f", {NEXT_GENERATION}" if end_sessions else ""
        async with self.engine.begin() as connection:
            await connection.execute(
                text(
                    f"UPDATE users SET password_hash = :hash{ending}, updated_at = :now "
                    "WHERE identifier = :who"
                ),
                {"who": identifier, "hash": password_hash, "now": _now()},
            )
