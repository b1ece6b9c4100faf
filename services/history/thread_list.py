"""The sidebar's list of conversations: one bounded statement per page, no messages loaded.

Chainlit 2.12's `SQLAlchemyDataLayer.list_threads` loads up to 1,000 of the user's conversations with
every message, element and feedback of each, filters and pages them in Python and returns the page's
conversations with all their messages: with large conversations one sidebar request answered 72 MB in
12 s and left the app 200 MB larger. The page shows a conversation's id, name, createdAt and its
`metadata.is_shared` icon; here one statement per page selects only those, at most `first` (bounded
by THREAD_LIST_PAGE_MAX) conversations, their names cut to MAX_THREAD_NAME_CHARS.

Chainlit's semantics are kept: newest last message first (conversations without messages last);
`cursor` is the id of the previous page's last conversation (unknown: from the start); `feedback`
keeps those with a feedback of that value. A `search` goes through the full-text index instead
(thread_search.py), which ranks by relevance. One difference: Chainlit ignores
`feedback=0` (a falsy value), here it means thumbs down; the page never sends that filter.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

from chainlit.types import PageInfo, PaginatedResponse, Pagination, ThreadDict, ThreadFilter

THREAD_LIST_PAGE_MAX = (
    50  # conversations one sidebar request lists at most (the page asks for 35, its search 20)
)
# Longest conversation name: a rename to a longer one is refused (web/stored_text.py), the name Chainlit
# makes from a conversation's first message is cut to it, and the sidebar lists no longer one.
MAX_THREAD_NAME_CHARS = 200
LAST_MESSAGE = 'COALESCE((SELECT MAX(s."createdAt") FROM steps s WHERE s."threadId" = t."id"), \'\')'
# Metadata is JSON text written by json.dumps (and, on an old Chainlit PostgreSQL database, jsonb, whose
# text has the same spacing): a text match needs no JSON functions, which differ by dialect and fail
# the whole statement on one malformed row.
SHARED = 'CAST(t."metadata" AS TEXT) LIKE \'%"is_shared": true%\''
FEEDBACK = (
    'EXISTS (SELECT 1 FROM feedbacks f JOIN steps s ON s."id" = f."forId" '
    'WHERE s."threadId" = t."id" AND f."value" = :feedback)'
)
AFTER_CURSOR = (
    "WHERE NOT EXISTS (SELECT 1 FROM listed c WHERE c.id = :cursor) "
    "OR EXISTS (SELECT 1 FROM listed c WHERE c.id = :cursor "
    "AND (listed.active < c.active OR (listed.active = c.active AND listed.id < c.id)))"
)


def page_statement(pagination: Pagination, filters: ThreadFilter) -> str:
    """The one statement that selects a page (and one more row, to tell whether a next page exists)."""
    conditions = ['t."userId" = :user_id']
    if filters.feedback is not None:
        conditions.append(FEEDBACK)
    return (
        'WITH listed AS (SELECT t."id" AS id, t."createdAt" AS created_at, '
        'SUBSTR(t."name", 1, :name_chars) AS name, t."userId" AS user_id, '
        f't."userIdentifier" AS user_identifier, t."tags" AS tags, {SHARED} AS shared, '
        f"{LAST_MESSAGE} AS active FROM threads t WHERE {' AND '.join(conditions)}) "
        "SELECT id, created_at, name, user_id, user_identifier, tags, shared FROM listed "
        f"{AFTER_CURSOR if pagination.cursor else ''} ORDER BY active DESC, id DESC LIMIT :limit"
    )


def page_parameters(
    pagination: Pagination, filters: ThreadFilter, page_max: int, name_chars: int
) -> dict[str, Any]:
    """The statement's values: the page size bounded by `page_max`."""
    parameters: dict[str, Any] = {
        "user_id": filters.userId,
        "name_chars": name_chars,
        "limit": page_size(pagination, page_max) + 1,
    }
    if filters.feedback is not None:
        parameters["feedback"] = int(filters.feedback)
    if pagination.cursor:
        parameters["cursor"] = pagination.cursor
    return parameters


def page_size(pagination: Pagination, page_max: int) -> int:
    return max(0, min(pagination.first, page_max))


def page_response(rows: list[dict[str, Any]], size: int) -> PaginatedResponse:
    """Chainlit's answer to the page: the conversations (without messages) and where the next page starts."""
    threads = [_thread(row) for row in rows[:size]]
    return PaginatedResponse(
        pageInfo=PageInfo(
            hasNextPage=len(rows) > size,
            startCursor=threads[0]["id"] if threads else None,
            endCursor=threads[-1]["id"] if threads else None,
        ),
        data=threads,
    )


def _thread(row: dict[str, Any]) -> ThreadDict:
    tags = row.get("tags")
    if isinstance(tags, str):  # stored as JSON text (data_layer._bindable)
        with contextlib.suppress(ValueError):
            tags = json.loads(tags)
    return ThreadDict(
        id=row["id"],
        createdAt=row["created_at"],
        name=row["name"],
        userId=row["user_id"],
        userIdentifier=row["user_identifier"],
        tags=tags,
        metadata={"is_shared": True} if row["shared"] else {},
        steps=[],
        elements=[],
    )
