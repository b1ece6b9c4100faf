"""The tables of limits shared by replicas (services/admission/shared_limits.py,
services/accounts/shared_attempts.py, services/admission/shared_line.py): created by migrations 15
and 16.

- `limit_leases`: one row per running turn of a person (`holder`: the replica's id), kept alive by
  its replica and lapsing at `expires_at` (seconds since the epoch) when that replica is gone;
- `limit_counts`: a person's answer tokens, documents and messages, one row per kind per second;
- `sign_in_attempts`: one row per counted sign-in attempt per key (account, address, both);
- `line_places` (migration 16): one row per replica (`holder`), when its waiting chat turns arrived
  (a JSON list of seconds since the epoch), renewed every SHARED_LINE_SECONDS and lapsing at
  `expires_at`; since migration 17 also its stream pace: requests it runs (`running`), its slowest
  stream's tokens/s (`slowest`) and its cap (`pace_cap`; NULL: none), and its document parts running
  (`documents`) and reading their prompt (`documents_prefilling`).
People, accounts and addresses are stored as digests (`person`, `key`), never as names. Every row
expires: writes delete a person's expired rows, and maintenance sweeps the rest.
"""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

STATEMENTS = (
    "CREATE TABLE IF NOT EXISTS limit_leases (id TEXT PRIMARY KEY, person TEXT NOT NULL, "
    "holder TEXT NOT NULL, expires_at DOUBLE PRECISION NOT NULL)",
    "CREATE INDEX IF NOT EXISTS limit_leases_person ON limit_leases (person, expires_at)",
    "CREATE INDEX IF NOT EXISTS limit_leases_holder ON limit_leases (holder)",
    "CREATE INDEX IF NOT EXISTS limit_leases_expires ON limit_leases (expires_at)",
    "CREATE TABLE IF NOT EXISTS limit_counts (person TEXT NOT NULL, kind TEXT NOT NULL, "
    "second BIGINT NOT NULL, n BIGINT NOT NULL, PRIMARY KEY (person, kind, second))",
    "CREATE INDEX IF NOT EXISTS limit_counts_second ON limit_counts (second)",
    "CREATE TABLE IF NOT EXISTS sign_in_attempts (id TEXT PRIMARY KEY, kind TEXT NOT NULL, "
    "key TEXT NOT NULL, at DOUBLE PRECISION NOT NULL)",
    "CREATE INDEX IF NOT EXISTS sign_in_attempts_key ON sign_in_attempts (kind, key, at)",
    "CREATE INDEX IF NOT EXISTS sign_in_attempts_at ON sign_in_attempts (at)",
)


async def shared_limit_tables(connection: AsyncConnection) -> None:
    for statement in STATEMENTS:
        await connection.execute(text(statement))


async def line_places_table(connection: AsyncConnection) -> None:
    await connection.execute(
        text(
            "CREATE TABLE IF NOT EXISTS line_places (holder TEXT PRIMARY KEY, places TEXT NOT NULL, "
            "expires_at DOUBLE PRECISION NOT NULL)"
        )
    )
