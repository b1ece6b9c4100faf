"""The sidebar's search: a person's own conversations whose name or a message holds every word typed.

The text (cut to THREAD_SEARCH_MAX_CHARS) is split into words (runs of letters and digits; all
else, quotes, `*`, `:`, parentheses, operators, is a separator), so nothing typed is ever query
syntax: FTS5 gets each word as a quoted string, PostgreSQL a tsquery built of bare words. The words
are ANDed within one message or the name; the last word also matches as a prefix while it is being
typed (from MIN_PREFIX_CHARS letters: one letter would match most of the vocabulary). A text with
no word matches nothing.

The index (search_index.py, search_index_upgrade.py) narrows the search to the person's entries;
on both databases the result is also joined to `threads` on `userId`, so a conversation of someone
else is never listed.
Conversations are ranked by their best-matching message or name (SQLite: the shortest one holding
every word; PostgreSQL: ts_rank, which also counts repeats) among the person's newest
THREAD_SEARCH_MAX_MATCHES matching messages (so a word found in nearly every message costs no more
than a rarer one), then by their newest message, and paged as the plain list is (thread_list.py):
at most THREAD_LIST_PAGE_MAX, `cursor` the id of the previous page's last conversation. Each row also
names its best-matching message (`best`, none when the name matched best), whose words around the
match are shown with the result (search_snippets.py).
"""

from __future__ import annotations

import re
from typing import Any

from chainlit.types import Pagination, ThreadFilter

from services.history.search_index import PG_CONFIGURATION
from services.history.search_index_upgrade import OWNER_PREFIX
from services.history.thread_list import FEEDBACK, LAST_MESSAGE, MAX_THREAD_NAME_CHARS, SHARED

MIN_PREFIX_CHARS = 2
THREAD_SEARCH_MAX_CHARS = 200  # longest text searched for; a longer search is cut to it
# Matching messages one search ranks at most (for words in more of a person's messages: their newest
# this many), so a search's time is bounded however common its words (bench/history/search.py).
THREAD_SEARCH_MAX_MATCHES = 1000
WORD = re.compile(r"[^\W_]+")

# The newest matches first (entries are numbered as they are stored), at most :matches; of those, the
# shorter message or name ranks first. Not bm25: it counts every entry of each word and of the
# owner over the whole index on every search (160 ms P50 for a word in most messages, bench).
SQLITE_HITS = (
    "matched AS MATERIALIZED (SELECT rowid AS entry, 1.0 / (1 + length(body)) AS score "
    "FROM conversation_search WHERE conversation_search MATCH :match ORDER BY rowid DESC LIMIT :matches), "
    "hits AS (SELECT r.thread_id AS thread_id, MAX(m.score) AS score, "
    "CASE WHEN r.kind = 's' THEN r.source_id END AS best FROM matched m "  # of the MAX's row (SQLite)
    "JOIN conversation_search_rows r ON r.entry = m.entry GROUP BY r.thread_id)"
)
PG_QUERY = f"to_tsquery('{PG_CONFIGURATION}', :tsquery)"
PG_OWNED = f"({PG_QUERY} && CAST(:owner_lexeme AS tsquery))"  # the words, in the person's messages only
# How the person's newest messages are searched (search_index_upgrade.py): if at least DENSE_OF_SAMPLE
# of their newest SAMPLE_MESSAGES hold the words, newest first until :matches are found (a few
# thousand rows at most); else the GIN index finds the person's matching messages (few), sorted.
# The walk's test is a CASE so the planner cannot estimate it (it takes half): it would judge the words
# by everyone's messages, not the person's, and sort all of a person's messages for a word rare overall.
SAMPLE_MESSAGES = 200
DENSE_OF_SAMPLE = 25
POSTGRES_HITS = (  # the newest matching messages, at most :matches, then ranked; and the matching names
    f"sample AS MATERIALIZED (SELECT COUNT(*) AS n FROM (SELECT s.search_vector FROM steps s "
    f'WHERE s.search_owner = :user_id ORDER BY s."createdAt" DESC LIMIT {SAMPLE_MESSAGES}) x '
    f"WHERE x.search_vector @@ {PG_QUERY}), "
    f"matched AS (SELECT m.thread_id, m.best, ts_rank(m.vector, {PG_QUERY}) AS score FROM ("
    '(SELECT s."threadId" AS thread_id, s."id" AS best, s.search_vector AS vector FROM steps s '
    f"WHERE s.search_owner = :user_id AND CASE WHEN s.search_vector @@ {PG_QUERY} THEN TRUE ELSE FALSE END "
    f'AND (SELECT n FROM sample) >= {DENSE_OF_SAMPLE} ORDER BY s."createdAt" DESC LIMIT :matches) '
    'UNION ALL (SELECT s."threadId", s."id", s.search_vector FROM steps s '
    f"WHERE s.search_vector @@ {PG_OWNED} "
    f'AND (SELECT n FROM sample) < {DENSE_OF_SAMPLE} ORDER BY s."createdAt" DESC LIMIT :matches) '
    'UNION ALL (SELECT o."id", NULL, o.search_vector FROM threads o '
    f'WHERE o."userId" = :user_id AND o.search_vector @@ {PG_QUERY} LIMIT :matches)) m), '
    "hits AS (SELECT DISTINCT ON (thread_id) thread_id, score, best FROM matched "
    "ORDER BY thread_id, score DESC, best NULLS FIRST)"
)
AFTER_CURSOR = (
    "WHERE NOT EXISTS (SELECT 1 FROM listed c WHERE c.id = :cursor) "
    "OR EXISTS (SELECT 1 FROM listed c WHERE c.id = :cursor AND (listed.score < c.score "
    "OR (listed.score = c.score AND (listed.active < c.active "
    "OR (listed.active = c.active AND listed.id < c.id)))))"
)


def search_words(search: str, max_chars: int) -> list[str]:
    """The words of what was typed, lowercased, each once, in order."""
    return list(dict.fromkeys(WORD.findall(search[:max_chars].lower())))


def fts5_query(words: list[str], user_id: str) -> str:
    """An FTS5 query of the person's entries holding every word (the last also as a prefix)."""
    quoted = [f'"{word}"' for word in words]  # a word has no quote: it is letters and digits only
    if len(words[-1]) >= MIN_PREFIX_CHARS:
        quoted[-1] += "*"
    return f'owner : "{owner_token(user_id)}" AND body : ({" AND ".join(quoted)})'


def owner_token(user_id: str) -> str:
    """What the index holds as a conversation's owner: SQLite's hex() of the thread's userId."""
    return user_id.encode().hex().upper()


def owner_lexeme(user_id: str) -> str:
    """What PostgreSQL's vectors hold as a message's owner (search_index_upgrade.py): no word has '@'."""
    return OWNER_PREFIX + user_id.encode().hex()


def owner_literal(user_id: str) -> str:
    """The owner lexeme as the SQL literal of a quoted tsquery lexeme: '@' and hex, nothing to escape."""
    return "'''" + owner_lexeme(user_id) + "'''"


def tsquery(words: list[str]) -> str:
    """A PostgreSQL tsquery of every word (the last also as a prefix); words are letters and digits."""
    terms = list(words)
    if len(terms[-1]) >= MIN_PREFIX_CHARS:
        terms[-1] += ":*"
    return " & ".join(terms)


def tsquery_literal(words: list[str]) -> str:
    """The tsquery as an SQL string literal. A bound parameter would do, but the driver prepares the
    statement and PostgreSQL then plans it once for every query: a plan for rare words (the GIN
    index over everyone's messages) took 1.6 s at P50 for a word in most messages (bench). Words are
    letters and digits only (search_words), and quotes would be doubled all the same."""
    return "'" + tsquery(words).replace("'", "''") + "'"


def search_statement(dialect: str, words: list[str], pagination: Pagination, filters: ThreadFilter) -> str:
    """One statement: the matching conversations of one person, best first, one page (and one more)."""
    conditions = ['t."userId" = :user_id']
    if filters.feedback is not None:
        conditions.append(FEEDBACK)
    if dialect == "postgresql":
        owned = owner_literal(filters.userId or "")
        hits = POSTGRES_HITS.replace(":tsquery", tsquery_literal(words)).replace(":owner_lexeme", owned)
    else:
        hits = SQLITE_HITS
    return (
        f'WITH {hits}, listed AS (SELECT t."id" AS id, t."createdAt" AS created_at, '
        'SUBSTR(t."name", 1, :name_chars) AS name, t."userId" AS user_id, '
        f't."userIdentifier" AS user_identifier, t."tags" AS tags, {SHARED} AS shared, '
        f"hits.score AS score, hits.best AS best, {LAST_MESSAGE} AS active "
        'FROM hits JOIN threads t ON t."id" = hits.thread_id '
        f"WHERE {' AND '.join(conditions)}) "
        "SELECT id, created_at, name, user_id, user_identifier, tags, shared, best FROM listed "
        f"{AFTER_CURSOR if pagination.cursor else ''} ORDER BY score DESC, active DESC, id DESC LIMIT :limit"
    )


def search_parameters(
    dialect: str, words: list[str], pagination: Pagination, filters: ThreadFilter, size: int
) -> dict[str, Any]:
    """The statement's values for a page of `size` (page_size); `words` not empty (search_words)."""
    assert filters.userId and words
    parameters: dict[str, Any] = {
        "user_id": filters.userId,
        "name_chars": MAX_THREAD_NAME_CHARS,
        "limit": size + 1,
        "matches": THREAD_SEARCH_MAX_MATCHES,
    }
    if dialect != "postgresql":  # PostgreSQL's words are in the statement (search_statement)
        parameters["match"] = fts5_query(words, filters.userId)
    if filters.feedback is not None:
        parameters["feedback"] = int(filters.feedback)
    if pagination.cursor:
        parameters["cursor"] = pagination.cursor
    return parameters
