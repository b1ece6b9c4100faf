"""The schema, created and upgraded at startup by an ordered list of versioned, idempotent steps.

Tables are Chainlit 2.12's (users, threads, steps, elements, feedbacks: every column its
SQLAlchemy data layer writes, since it swallows the error of a missing one) plus ours: the
accounts' columns on `users`, `thread_documents` (a conversation's document), `service_health`
(the write probe), `api_keys` (hashes of the API keys), `users.session_generation` (what ends
an account's sign-ins), `identity_links` (provider identities an administrator linked to an
account), `usage_days` and `quotas` (usage_schema.py), `audit_log` (services/audit/:
append-only), `shares` (read-only snapshots behind share links), `imports` (each import's size, for
its limits per person), the full-text search index (search_index.py) and the limits replicas share
(limits_schema.py). Ids and JSON are TEXT on both
databases, so one set of statements serves both. Each step runs once, recorded in
`schema_migrations`; every statement is safe to run again (IF NOT EXISTS, columns added only when
missing), so an existing Chainlit database is upgraded in place. Replicas starting together take
a lock first (PostgreSQL advisory lock, SQLite write lock).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import inspect, text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from services.history.limits_schema import line_places_table, shared_limit_tables
from services.history.search_index import create_search_index
from services.history.search_index_upgrade import upgrade_search_index
from services.history.usage_schema import quotas_table, usage_days_table

logger = logging.getLogger(__name__)

MIGRATION_LOCK_KEY = 7_311_042  # pg_advisory_xact_lock key of this app's migrations

# Every column Chainlit 2.12's SQLAlchemyDataLayer reads or writes, by table (type names: see _TYPES).
CHAINLIT_COLUMNS: dict[str, dict[str, str]] = {
    "users": {"id": "id", "identifier": "text", "metadata": "json", "createdAt": "text"},
    "threads": {
        "id": "id",
        "createdAt": "text",
        "name": "text",
        "userId": "id",
        "userIdentifier": "text",
        "tags": "json",
        "metadata": "json",
    },
    "steps": {
        "id": "id",
        "name": "text",
        "type": "text",
        "threadId": "id",
        "parentId": "id",
        "streaming": "bool",
        "waitForAnswer": "bool",
        "isError": "bool",
        "metadata": "json",
        "tags": "json",
        "input": "text",
        "output": "text",
        "createdAt": "text",
        "command": "text",
        "start": "text",
        "end": "text",
        "generation": "json",
        "showInput": "text",
        "language": "text",
        "indent": "int",
        "defaultOpen": "bool",
        "autoCollapse": "bool",
        "modes": "json",
        "icon": "text",
    },
    "elements": {
        "id": "id",
        "threadId": "id",
        "type": "text",
        "url": "text",
        "chainlitKey": "text",
        "name": "text",
        "display": "text",
        "objectKey": "text",
        "size": "text",
        "page": "int",
        "language": "text",
        "forId": "id",
        "mime": "text",
        "props": "json",
        "autoPlay": "bool",
        "playerConfig": "json",
    },
    "feedbacks": {"id": "id", "forId": "id", "threadId": "id", "value": "int", "comment": "text"},
}
ACCOUNT_COLUMNS = {"password_hash": "text", "role": "text", "disabled": "bool", "updated_at": "text"}
# Moved by every change that ends an account's sign-ins (services/accounts/sessions.py); NULL = 0.
SESSION_COLUMNS = {"session_generation": "int"}
# What each app replica shares beside its waiting places (limits_schema.py): its stream pace, its documents.
LINE_SHARE_COLUMNS = {
    "running": "int",
    "slowest": "float",
    "pace_cap": "int",
    "documents": "int",
    "documents_prefilling": "int",
}
_TYPES = {
    "id": "TEXT",
    "text": "TEXT",
    "json": "TEXT",
    "int": "INTEGER",
    "bool": "BOOLEAN",
    "float": "DOUBLE PRECISION",
}
_NOT_NULL = {
    ("users", "identifier"),
    ("steps", "name"),
    ("steps", "type"),
    ("steps", "threadId"),
    ("elements", "name"),
    ("feedbacks", "forId"),
    ("feedbacks", "value"),
}


def _create_table(table: str, columns: dict[str, str]) -> str:
    parts = []
    for name, kind in columns.items():
        constraint = " PRIMARY KEY" if name == "id" else (" NOT NULL" if (table, name) in _NOT_NULL else "")
        parts.append(f'"{name}" {_TYPES[kind]}{constraint}')
    return f"CREATE TABLE IF NOT EXISTS {table} ({', '.join(parts)})"


async def _ensure_columns(connection: AsyncConnection, table: str, columns: dict[str, str]) -> None:
    """Add the columns `table` lacks (a database made by an older Chainlit, or by an older app)."""
    existing = await connection.run_sync(lambda sync: {c["name"] for c in inspect(sync).get_columns(table)})
    for name, kind in columns.items():
        if name not in existing:
            logger.info("schema: adding column %s.%s", table, name)
            await connection.execute(text(f'ALTER TABLE {table} ADD COLUMN "{name}" {_TYPES[kind]}'))


async def _chainlit_tables(connection: AsyncConnection) -> None:
    for table, columns in CHAINLIT_COLUMNS.items():
        await connection.execute(text(_create_table(table, columns)))
        await _ensure_columns(connection, table, columns)


async def _accounts(connection: AsyncConnection) -> None:
    await _ensure_columns(connection, "users", ACCOUNT_COLUMNS)
    await connection.execute(
        text('CREATE UNIQUE INDEX IF NOT EXISTS users_identifier ON users ("identifier")')
    )


async def _indexes(connection: AsyncConnection) -> None:
    for name, table, column in (
        ("threads_user", "threads", "userId"),
        ("threads_user_identifier", "threads", "userIdentifier"),
        ("threads_created", "threads", "createdAt"),
        ("steps_thread", "steps", "threadId"),
        ("elements_thread", "elements", "threadId"),
        ("feedbacks_for", "feedbacks", "forId"),
    ):
        await connection.execute(text(f'CREATE INDEX IF NOT EXISTS {name} ON {table} ("{column}")'))


async def _documents_and_health(connection: AsyncConnection) -> None:
    await connection.execute(
        text(
            "CREATE TABLE IF NOT EXISTS thread_documents (thread_id TEXT PRIMARY KEY, name TEXT NOT NULL, "
            "text TEXT NOT NULL, tokens INTEGER NOT NULL, created_at TEXT NOT NULL)"
        )
    )
    await connection.execute(
        text("CREATE TABLE IF NOT EXISTS service_health (id INTEGER PRIMARY KEY, checked_at TEXT)")
    )
    await connection.execute(
        text("INSERT INTO service_health (id, checked_at) VALUES (1, :now) ON CONFLICT (id) DO NOTHING"),
        {"now": _now()},
    )


async def _api_keys(connection: AsyncConnection) -> None:
    await connection.execute(
        text(
            "CREATE TABLE IF NOT EXISTS api_keys (id TEXT PRIMARY KEY, user_identifier TEXT NOT NULL, "
            "prefix TEXT NOT NULL, key_hash TEXT NOT NULL, created_at TEXT NOT NULL, "
            "last_used_at TEXT, revoked_at TEXT)"
        )
    )
    await connection.execute(text("CREATE UNIQUE INDEX IF NOT EXISTS api_keys_hash ON api_keys (key_hash)"))
    await connection.execute(text("CREATE INDEX IF NOT EXISTS api_keys_user ON api_keys (user_identifier)"))


async def _sessions(connection: AsyncConnection) -> None:
    await _ensure_columns(connection, "users", SESSION_COLUMNS)


async def _identity_links(connection: AsyncConnection) -> None:
    await connection.execute(
        text(
            "CREATE TABLE IF NOT EXISTS identity_links (identity TEXT PRIMARY KEY, account TEXT NOT NULL, "
            "created_at TEXT NOT NULL)"
        )
    )
    await connection.execute(
        text("CREATE INDEX IF NOT EXISTS identity_links_account ON identity_links (account)")
    )


async def _audit_log(connection: AsyncConnection) -> None:
    await connection.execute(
        text(
            "CREATE TABLE IF NOT EXISTS audit_log (id TEXT PRIMARY KEY, at TEXT NOT NULL, "
            "actor TEXT NOT NULL, action TEXT NOT NULL, target TEXT, address TEXT, details TEXT)"
        )
    )
    for column in ("at", "actor", "action"):
        name = f"audit_log_{column}"
        await connection.execute(text(f"CREATE INDEX IF NOT EXISTS {name} ON audit_log ({column})"))


async def _shares(connection: AsyncConnection) -> None:
    """Share links: a read-only snapshot of a conversation, found by the sha256 of its token."""
    await connection.execute(
        text(
            "CREATE TABLE IF NOT EXISTS shares (id TEXT PRIMARY KEY, token_hash TEXT NOT NULL, "
            "thread_id TEXT NOT NULL, owner TEXT NOT NULL, title TEXT NOT NULL, snapshot TEXT NOT NULL, "
            "created_at TEXT NOT NULL, expires_at TEXT NOT NULL, revoked_at TEXT)"
        )
    )
    await connection.execute(text("CREATE UNIQUE INDEX IF NOT EXISTS shares_token ON shares (token_hash)"))
    await connection.execute(text("CREATE INDEX IF NOT EXISTS shares_thread ON shares (thread_id)"))


async def _presets(connection: AsyncConnection) -> None:
    """A person's default chat settings and named prompt templates (services/presets)."""
    await connection.execute(
        text(
            "CREATE TABLE IF NOT EXISTS user_presets (user_identifier TEXT PRIMARY KEY, "
            "settings TEXT NOT NULL, updated_at TEXT NOT NULL)"
        )
    )
    await connection.execute(
        text(
            "CREATE TABLE IF NOT EXISTS prompt_templates (user_identifier TEXT NOT NULL, name TEXT NOT NULL, "
            "text TEXT NOT NULL, created_at TEXT NOT NULL, PRIMARY KEY (user_identifier, name))"
        )
    )


async def _imports(connection: AsyncConnection) -> None:
    """Each import a person started, and what it stored: the per-hour and per-day limits of imports
    (services/transfer/limits.py) count these rows, so replicas on one database count alike."""
    await connection.execute(
        text(
            "CREATE TABLE IF NOT EXISTS imports (id TEXT PRIMARY KEY, owner TEXT NOT NULL, "
            "started_at TEXT NOT NULL, state TEXT NOT NULL, messages INTEGER NOT NULL, "
            "stored_bytes INTEGER NOT NULL)"
        )
    )
    await connection.execute(text("CREATE INDEX IF NOT EXISTS imports_owner ON imports (owner, started_at)"))


async def _line_share(connection: AsyncConnection) -> None:
    await _ensure_columns(connection, "line_places", LINE_SHARE_COLUMNS)


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    apply: Callable[[AsyncConnection], object]


MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "Chainlit 2.12 tables with every column its data layer writes", _chainlit_tables),
    Migration(2, "accounts: password hash, role, disabled on users", _accounts),
    Migration(3, "indexes for listing, resuming and deleting conversations", _indexes),
    Migration(4, "conversation documents and the health probe row", _documents_and_health),
    Migration(5, "API keys: sha256 of each key, its shown prefix, owner, revocation", _api_keys),
    Migration(6, "sessions: a generation per account, moved to end its sign-ins", _sessions),
    Migration(7, "provider identities (github:login) an administrator linked to an account", _identity_links),
    Migration(
        8, "usage per person per UTC day: tokens, turns, documents, API calls, refusals", usage_days_table
    ),
    Migration(9, "quotas: a person's own token budget per day or month", quotas_table),
    Migration(10, "audit log: who did what, append-only (services/audit/)", _audit_log),
    Migration(11, "full-text search of conversation names and messages", create_search_index),
    Migration(12, "share links: token hash, owner, snapshot, expiry, revocation", _shares),
    Migration(13, "presets: default chat settings and prompt templates per person", _presets),
    Migration(14, "search: owner-scoped PostgreSQL index, SQLite prefix indexes", upgrade_search_index),
    Migration(15, "limits replicas share: turn leases, counts, sign-in attempts", shared_limit_tables),
    Migration(16, "waiting lines replicas share: when each one's waiting turns arrived", line_places_table),
    Migration(17, "waiting lines replicas share: running, documents, slowest stream, pace cap", _line_share),
    Migration(18, "imports: who started one when, and what it stored", _imports),
)
LATEST_VERSION = MIGRATIONS[-1].version


def _now() -> str:
    return datetime.now(UTC).isoformat()


async def migrate(engine: AsyncEngine) -> list[int]:
    """Bring the schema to LATEST_VERSION; return the versions applied now (empty when up to date)."""
    async with engine.begin() as connection:
        if engine.dialect.name == "postgresql":
            await connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
        else:  # take SQLite's write lock now, so a second process waits here instead of failing midway
            await connection.execute(text("CREATE TABLE IF NOT EXISTS schema_lock (id INTEGER)"))
            await connection.execute(text("DELETE FROM schema_lock"))
        await connection.execute(
            text(
                "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, "
                "name TEXT NOT NULL, applied_at TEXT NOT NULL)"
            )
        )
        done = {row[0] for row in await connection.execute(text("SELECT version FROM schema_migrations"))}
        applied = []
        for migration in MIGRATIONS:
            if migration.version in done:
                continue
            await migration.apply(connection)  # type: ignore[misc]
            await connection.execute(
                text("INSERT INTO schema_migrations (version, name, applied_at) VALUES (:v, :n, :t)"),
                {"v": migration.version, "n": migration.name, "t": _now()},
            )
            applied.append(migration.version)
            logger.info("schema: applied migration %d (%s)", migration.version, migration.name)
    return applied
