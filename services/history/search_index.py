"""The full-text index of a person's conversations: their names and their messages' words.

What is indexed: each conversation's name and the text of each user and assistant message
(`steps.output` of types user_message and assistant_message). Not a document's text: a long
document holds most common words, so every search would match every conversation with one, and
the index would grow by whole documents; the message sent with a document is indexed.

- SQLite: an FTS5 table `conversation_search` (unicode61 tokenizer: any language written with
  spaces between words, case and accents folded) with an `owner` column (hex of the thread's
  userId), so a search reads only its person's entries. `conversation_search_rows` maps each
  entry to its message or conversation name and its conversation, so triggers delete and rewrite
  an entry without scanning the index (an external-content table would key on steps' rowid,
  which VACUUM may renumber).
- PostgreSQL: a stored generated `search_vector tsvector` column on steps and on threads, each
  with a GIN index. The configuration is 'simple': lowercased words, no stemming and no stop
  words, so it is language-neutral and finds what SQLite finds (accents are not folded there:
  that needs the unaccent extension, which only a superuser may create). Migration 14
  (search_index_upgrade.py) makes steps' a trigger-kept column that also holds the owner.

Every statement can run again: the migration drops and rebuilds the SQLite index and its triggers
(a backfill of the rows already stored) and creates PostgreSQL's columns and indexes if missing.
"""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

INDEXED_TYPES = "('user_message', 'assistant_message')"
SQLITE_TOKENIZER = "unicode61 remove_diacritics 2"
# FTS5 keeps a ready list of the entries of every 2- and 3-letter word start: a short prefix typed
# ("in", "pad") reads that list instead of merging those of all its words (30 ms for "the", bench).
SQLITE_PREFIXES = "2 3"
PG_CONFIGURATION = "simple"
BUILD_TIMEOUT_SECONDS = 3600  # PostgreSQL: longest a statement of the build may take (the first start)

# SQLite: entry (the index's rowid), what it holds ('s' a message, 'n' a conversation's name), whose.
SQLITE_TABLES = (
    "DROP TABLE IF EXISTS conversation_search",
    "DROP TABLE IF EXISTS conversation_search_rows",
    "CREATE TABLE conversation_search_rows (entry INTEGER PRIMARY KEY, kind TEXT NOT NULL, "
    "source_id TEXT NOT NULL, thread_id TEXT NOT NULL, UNIQUE (kind, source_id))",
    "CREATE INDEX conversation_search_rows_thread ON conversation_search_rows (thread_id)",
    "CREATE VIRTUAL TABLE conversation_search USING fts5(body, owner, "
    f"tokenize='{SQLITE_TOKENIZER}', prefix='{SQLITE_PREFIXES}')",
)
OWNER_OF_STEP = '(SELECT hex(t."userId") FROM threads t WHERE t."id" = NEW."threadId")'
STEP_INDEXED = f"NEW.\"type\" IN {INDEXED_TYPES} AND COALESCE(NEW.\"output\", '') <> ''"
NAME_INDEXED = "COALESCE(NEW.\"name\", '') <> ''"


def _forget(kind: str, source: str) -> str:
    """Statements of a trigger that drop the entry of (kind, source)."""
    return (
        "DELETE FROM conversation_search WHERE rowid IN (SELECT entry FROM conversation_search_rows "
        f"WHERE kind = '{kind}' AND source_id = {source}); "
        f"DELETE FROM conversation_search_rows WHERE kind = '{kind}' AND source_id = {source};"
    )


def _remember(kind: str, thread: str, body: str, owner: str, when: str) -> str:
    """Statements of a trigger that add the entry of NEW (its row first, then its words at that rowid)."""
    return (
        "INSERT INTO conversation_search_rows (kind, source_id, thread_id) "
        f"SELECT '{kind}', NEW.\"id\", {thread} WHERE {when}; "
        "INSERT INTO conversation_search (rowid, body, owner) "
        f"SELECT last_insert_rowid(), {body}, {owner} WHERE {when};"
    )


SQLITE_TRIGGERS = {
    "conversation_search_step_added": "AFTER INSERT ON steps BEGIN "
    + _forget("s", 'NEW."id"')
    + _remember("s", 'NEW."threadId"', 'NEW."output"', OWNER_OF_STEP, STEP_INDEXED)
    + " END",
    "conversation_search_step_changed": 'AFTER UPDATE ON steps WHEN OLD."output" IS NOT NEW."output" '
    'OR OLD."type" IS NOT NEW."type" OR OLD."threadId" IS NOT NEW."threadId" OR OLD."id" IS NOT NEW."id" '
    "BEGIN "
    + _forget("s", 'OLD."id"')
    + _remember("s", 'NEW."threadId"', 'NEW."output"', OWNER_OF_STEP, STEP_INDEXED)
    + " END",
    "conversation_search_step_deleted": "AFTER DELETE ON steps BEGIN " + _forget("s", 'OLD."id"') + " END",
    "conversation_search_thread_added": "AFTER INSERT ON threads BEGIN "
    + _forget("n", 'NEW."id"')
    + _remember("n", 'NEW."id"', 'NEW."name"', 'hex(NEW."userId")', NAME_INDEXED)
    + " END",
    "conversation_search_thread_renamed": 'AFTER UPDATE OF "name" ON threads '
    'WHEN OLD."name" IS NOT NEW."name" BEGIN '
    + _forget("n", 'OLD."id"')
    + _remember("n", 'NEW."id"', 'NEW."name"', 'hex(NEW."userId")', NAME_INDEXED)
    + " END",
    "conversation_search_thread_owner": 'AFTER UPDATE OF "userId" ON threads '
    'WHEN OLD."userId" IS NOT NEW."userId" BEGIN '
    'UPDATE conversation_search SET owner = hex(NEW."userId") WHERE rowid IN '
    '(SELECT entry FROM conversation_search_rows WHERE thread_id = NEW."id"); END',
    "conversation_search_thread_deleted": "AFTER DELETE ON threads BEGIN "
    "DELETE FROM conversation_search WHERE rowid IN "
    '(SELECT entry FROM conversation_search_rows WHERE thread_id = OLD."id"); '
    'DELETE FROM conversation_search_rows WHERE thread_id = OLD."id"; END',
}
SQLITE_BACKFILL = (
    "INSERT INTO conversation_search_rows (kind, source_id, thread_id) "
    f'SELECT \'s\', "id", "threadId" FROM steps WHERE "type" IN {INDEXED_TYPES} '
    "AND COALESCE(\"output\", '') <> '' AND \"threadId\" IS NOT NULL",
    "INSERT INTO conversation_search_rows (kind, source_id, thread_id) "
    "SELECT 'n', \"id\", \"id\" FROM threads WHERE COALESCE(\"name\", '') <> ''",
    "INSERT INTO conversation_search (rowid, body, owner) "
    'SELECT r.entry, s."output", hex(t."userId") FROM conversation_search_rows r '
    'JOIN steps s ON s."id" = r.source_id LEFT JOIN threads t ON t."id" = s."threadId" WHERE r.kind = \'s\'',
    "INSERT INTO conversation_search (rowid, body, owner) "
    'SELECT r.entry, t."name", hex(t."userId") FROM conversation_search_rows r '
    "JOIN threads t ON t.\"id\" = r.source_id WHERE r.kind = 'n'",
    "INSERT INTO conversation_search (conversation_search) VALUES ('optimize')",
)


def _pg_vector(source: str) -> str:
    return f"to_tsvector('{PG_CONFIGURATION}', COALESCE({source}, ''))"


POSTGRES_STATEMENTS = (
    "ALTER TABLE steps ADD COLUMN IF NOT EXISTS search_vector tsvector GENERATED ALWAYS AS "
    f'(CASE WHEN "type" IN {INDEXED_TYPES} THEN {_pg_vector(chr(34) + "output" + chr(34))} END) STORED',
    "ALTER TABLE threads ADD COLUMN IF NOT EXISTS search_vector tsvector GENERATED ALWAYS AS "
    f"({_pg_vector(chr(34) + 'name' + chr(34))}) STORED",
    "CREATE INDEX IF NOT EXISTS steps_search ON steps USING GIN (search_vector)",
    "CREATE INDEX IF NOT EXISTS threads_search ON threads USING GIN (search_vector)",
    "ANALYZE steps",
    "ANALYZE threads",
)


# A conversation's newest message in one seek: search ranks, then orders its hits by it.
LAST_MESSAGE_INDEX = 'CREATE INDEX IF NOT EXISTS steps_thread_created ON steps ("threadId", "createdAt")'


async def create_search_index(connection: AsyncConnection) -> None:
    """Build (or rebuild) the index and fill it from the conversations already stored."""
    await connection.execute(text(LAST_MESSAGE_INDEX))
    if connection.dialect.name == "postgresql":
        # Straight on asyncpg, for a timeout of its own: adding the columns rewrites both tables, longer
        # than the app's 60 s statement timeout on a large history (500,000 messages on a busy machine).
        driver = (await connection.get_raw_connection()).driver_connection
        for statement in POSTGRES_STATEMENTS:
            await driver.execute(statement, timeout=BUILD_TIMEOUT_SECONDS)  # type: ignore[union-attr]
        return
    await build_sqlite_index(connection)


async def build_sqlite_index(connection: AsyncConnection) -> None:
    """Drop and rebuild SQLite's index, its map and its triggers, filled from what is stored."""
    for name in SQLITE_TRIGGERS:
        await connection.execute(text(f"DROP TRIGGER IF EXISTS {name}"))
    for statement in SQLITE_TABLES:
        await connection.execute(text(statement))
    for statement in SQLITE_BACKFILL:
        await connection.execute(text(statement))
    for name, body in SQLITE_TRIGGERS.items():
        await connection.execute(text(f"CREATE TRIGGER {name} {body}"))
