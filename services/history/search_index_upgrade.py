"""The search index made fast for a person with a large history (migration 14, over search_index.py).

- PostgreSQL: each indexed message gets `steps.search_owner` (its conversation's userId) and its
  `search_vector` holds, beside its words, an owner lexeme ('@' and the hex of that userId: no
  typed word has '@', so no search can match it). Both are kept by triggers (the vector was a
  generated column, which cannot read `threads`). So the GIN index finds only the person's
  matching messages (it read everyone's, 10 times as many with 10 people), and a word found in
  most messages walks the person's messages newest first in `steps_search_owner` and stops at
  THREAD_SEARCH_MAX_MATCHES (it read all 50,000 of them to sort them: 200 ms, bench).
- SQLite: the FTS5 table is rebuilt with its prefix indexes (search_index.py's SQLITE_PREFIXES) when
  it lacks them.

Every statement can run again; the rebuild of an existing index runs once, with the migration.
"""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from services.history.search_index import (
    BUILD_TIMEOUT_SECONDS,
    INDEXED_TYPES,
    PG_CONFIGURATION,
    build_sqlite_index,
)

OWNER_PREFIX = "@"


def _owner_lexeme(owner: str) -> str:
    """SQL of the owner lexeme of `owner` as a tsvector (empty when `owner` is NULL)."""
    return (
        f"CASE WHEN {owner} IS NULL THEN ''::tsvector ELSE array_to_tsvector(ARRAY['{OWNER_PREFIX}' || "
        f"encode(convert_to({owner}, 'UTF8'), 'hex')]) END"
    )


def _message_vector(output: str, owner: str) -> str:
    return f"to_tsvector('{PG_CONFIGURATION}', COALESCE({output}, '')) || {_owner_lexeme(owner)}"


STORED_MESSAGE_VECTOR = _message_vector('s."output"', 't."userId"')
STEP_FUNCTION = f"""CREATE OR REPLACE FUNCTION conversation_search_step() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  IF NEW."type" IN {INDEXED_TYPES} THEN
    NEW.search_owner := (SELECT t."userId" FROM threads t WHERE t."id" = NEW."threadId");
    NEW.search_vector := {_message_vector('NEW."output"', "NEW.search_owner")};
  ELSE
    NEW.search_owner := NULL;
    NEW.search_vector := NULL;
  END IF;
  RETURN NEW;
END $$"""
# A conversation stored or given to someone: its messages' owner is read again (the step trigger).
THREAD_FUNCTION = """CREATE OR REPLACE FUNCTION conversation_search_thread() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'INSERT' OR OLD."userId" IS DISTINCT FROM NEW."userId" THEN
    UPDATE steps SET "threadId" = "threadId" WHERE "threadId" = NEW."id";
  END IF;
  RETURN NULL;
END $$"""
POSTGRES_STATEMENTS = (
    "ALTER TABLE steps ALTER COLUMN search_vector DROP EXPRESSION IF EXISTS",
    "ALTER TABLE steps ADD COLUMN IF NOT EXISTS search_owner TEXT",
    STEP_FUNCTION,
    THREAD_FUNCTION,
    "DROP TRIGGER IF EXISTS conversation_search_step ON steps",
    "DROP TRIGGER IF EXISTS conversation_search_thread ON threads",
    "DROP INDEX IF EXISTS steps_search",  # rebuilt once below: faster than 1 insert per updated row
    'UPDATE steps s SET search_owner = t."userId", '
    f"search_vector = {STORED_MESSAGE_VECTOR} "
    f'FROM threads t WHERE t."id" = s."threadId" AND s."type" IN {INDEXED_TYPES}',
    'CREATE TRIGGER conversation_search_step BEFORE INSERT OR UPDATE OF "output", "type", "threadId" '
    "ON steps FOR EACH ROW EXECUTE FUNCTION conversation_search_step()",
    'CREATE TRIGGER conversation_search_thread AFTER INSERT OR UPDATE OF "userId" ON threads '
    "FOR EACH ROW EXECUTE FUNCTION conversation_search_thread()",
    "CREATE INDEX IF NOT EXISTS steps_search ON steps USING GIN (search_vector)",
    'CREATE INDEX IF NOT EXISTS steps_search_owner ON steps (search_owner, "createdAt") '
    "WHERE search_owner IS NOT NULL",
    "ANALYZE steps",
)


async def upgrade_search_index(connection: AsyncConnection) -> None:
    """Scope PostgreSQL's index by owner; give SQLite's its prefix indexes (a rebuild when missing)."""
    if connection.dialect.name == "postgresql":
        driver = (await connection.get_raw_connection()).driver_connection
        for statement in POSTGRES_STATEMENTS:  # the update rewrites every message: a timeout of its own
            await driver.execute(statement, timeout=BUILD_TIMEOUT_SECONDS)  # type: ignore[union-attr]
        return
    table = await connection.execute(
        text("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'conversation_search'")
    )
    definition = table.scalar() or ""
    if "prefix=" not in definition.replace(" ", ""):
        await build_sqlite_index(connection)
