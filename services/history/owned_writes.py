"""Writes of a conversation, kept only while the account that writes them exists.

When an account is removed, writes of its may still be under way: an answer streaming on another
replica, a tab's chat settings stored at its disconnect, the first message of a new chat sent just
before. Chainlit makes them through the data layer, in the Chainlit context of the person's session.
Each runs in one transaction that ends by reading the writer's user row: not disabled and still
under the same row id (a name given back gets a new one), locked against change (PostgreSQL: FOR
SHARE; SQLite holds its one write lock from the transaction's first write). When the row no longer
qualifies, the transaction is rolled back. So a write either commits before the removal disables the
row, and the removal, which lists the account's conversations after that, deletes it; or it is not
stored at all.

A conversation that a write creates belongs to the writer (`userId`, `userIdentifier`), so that
removal finds it: Chainlit's step writes create a missing thread without an owner.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from chainlit.context import context_var

Statement = tuple[str, dict[str, Any]]


@dataclass(frozen=True)
class Writer:
    """The stored user a write is made for: their user row's id and their name."""

    user_id: str
    identifier: str


def current_writer() -> Writer | None:
    """The stored user of the Chainlit context a write runs in; None outside one, or without a user row."""
    try:
        user = context_var.get().session.user
    except LookupError:
        return None
    user_id, identifier = getattr(user, "id", None), getattr(user, "identifier", None)
    if isinstance(user_id, str) and isinstance(identifier, str):
        return Writer(user_id, identifier)
    return None


def live_writer(dialect: str) -> str:
    """The last statement of an owned write: a row when the writer's account (`:writer`) may write."""
    lock = " FOR SHARE" if dialect == "postgresql" else ""
    return f'SELECT 1 FROM users WHERE "id" = :writer AND (disabled IS NULL OR disabled = FALSE){lock}'


def merged_metadata(stored: Any, metadata: dict[str, Any] | None) -> dict[str, Any]:
    """Chainlit's merge of a thread's stored metadata with an update: a None value deletes its key."""
    base: Any = stored or {}
    if isinstance(base, str):
        try:
            base = json.loads(base)
        except json.JSONDecodeError:
            base = {}
    base = base if isinstance(base, dict) else {}
    incoming = metadata or {}
    deleted = {key for key, value in incoming.items() if value is None}
    kept = {key: value for key, value in base.items() if key not in deleted}
    return {**kept, **{key: value for key, value in incoming.items() if value is not None}}


def thread_upsert(
    thread_id: str,
    values: dict[str, Any],
    owner: Writer | None,
    new_owner: Writer | None,
) -> Statement:
    """Chainlit's thread upsert (`SQLAlchemyDataLayer.update_thread`): `values` (createdAt, name, tags,
    metadata; None = unchanged) and `owner`, who Chainlit said owns it; `new_owner` owns it only if the
    write creates it (the writer, when Chainlit named nobody)."""
    data = dict(values)
    if owner is not None:
        data.update({"userId": owner.user_id, "userIdentifier": owner.identifier})
    parameters = {"id": thread_id, **{key: value for key, value in data.items() if value is not None}}
    updates = ", ".join(f'"{key}" = EXCLUDED."{key}"' for key in parameters if key != "id")
    if owner is None and new_owner is not None:
        parameters.update({"userId": new_owner.user_id, "userIdentifier": new_owner.identifier})
    columns = ", ".join(f'"{key}"' for key in parameters)
    placeholders = ", ".join(f":{key}" for key in parameters)
    conflict = f"DO UPDATE SET {updates}" if updates else "DO NOTHING"
    query = f'INSERT INTO threads ({columns}) VALUES ({placeholders}) ON CONFLICT ("id") {conflict}'
    return query, parameters
