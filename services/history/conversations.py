"""Rows of a conversation beyond what Chainlit stores: its document, and deleting conversations in bulk.

Bulk deletes (retention, the per-user cap, an account's removal) remove every row of each
conversation, in one transaction per batch: feedbacks, elements, steps, the document, its share
links, the thread.
The length cap deletes a long conversation's oldest turns the same way.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial

from sqlalchemy import bindparam, text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

DELETE_BATCH = 200  # conversations deleted per transaction
# How often retention and the per-user cap sweep: each sweep deletes DELETE_BATCH
# conversations per maintenance round until the rules hold. Shorter: small steady deletes beside the
# chat's saves; longer: fewer scans of the whole history, in larger bursts.
HISTORY_RETENTION_INTERVAL_SECONDS = 300.0


@dataclass(frozen=True)
class StoredDocument:
    name: str
    text: str
    tokens: int


def timestamp(at: datetime) -> str:
    """Chainlit's timestamp format (UTC, ISO, trailing Z), so stored times compare as text."""
    return at.astimezone(UTC).replace(tzinfo=None).isoformat() + "Z"


async def save_document(engine: AsyncEngine, thread_id: str, document: StoredDocument) -> None:
    """Keep the conversation's document (one per conversation: a new upload replaces it)."""
    async with engine.begin() as connection:
        await connection.execute(
            text(
                "INSERT INTO thread_documents (thread_id, name, text, tokens, created_at) "
                "VALUES (:id, :name, :text, :tokens, :at) ON CONFLICT (thread_id) DO UPDATE SET "
                "name = excluded.name, text = excluded.text, tokens = excluded.tokens, "
                "created_at = excluded.created_at"
            ),
            {
                "id": thread_id,
                "name": document.name,
                "text": document.text,
                "tokens": document.tokens,
                "at": timestamp(datetime.now(UTC)),
            },
        )


async def load_document(engine: AsyncEngine, thread_id: str) -> StoredDocument | None:
    async with engine.connect() as connection:
        row = (
            await connection.execute(
                text("SELECT name, text, tokens FROM thread_documents WHERE thread_id = :id"),
                {"id": thread_id},
            )
        ).first()
    return None if row is None else StoredDocument(row[0], row[1], int(row[2]))


async def _execute_for_ids(
    connection: AsyncConnection, ids: list[str], statements: tuple[str, ...], **params: str
) -> None:
    """Run each statement with `:ids` bound to the list `ids` (and any other `params`)."""
    for statement in statements:
        bound = text(statement).bindparams(bindparam("ids", expanding=True))
        await connection.execute(bound, {"ids": ids, **params})


async def _delete_batch(connection: AsyncConnection, thread_ids: list[str]) -> None:
    await _execute_for_ids(
        connection,
        thread_ids,
        (
            'DELETE FROM feedbacks WHERE "forId" IN (SELECT "id" FROM steps WHERE "threadId" IN :ids)',
            'DELETE FROM feedbacks WHERE "threadId" IN :ids',
            'DELETE FROM elements WHERE "threadId" IN :ids',
            'DELETE FROM steps WHERE "threadId" IN :ids',
            "DELETE FROM thread_documents WHERE thread_id IN :ids",
            "DELETE FROM shares WHERE thread_id IN :ids",  # its share links end with it
            'DELETE FROM threads WHERE "id" IN :ids',
        ),
    )


async def delete_threads(engine: AsyncEngine, thread_ids: list[str]) -> int:
    """Delete these conversations with every row they own; return how many."""
    for start in range(0, len(thread_ids), DELETE_BATCH):
        async with engine.begin() as connection:
            await _delete_batch(connection, thread_ids[start : start + DELETE_BATCH])
    return len(thread_ids)


async def thread_ids_of_user(engine: AsyncEngine, identifier: str, user_id: str | None = None) -> list[str]:
    """The conversations stored under a person's name, or under their user row's id when given."""
    async with engine.connect() as connection:
        rows = await connection.execute(
            text('SELECT "id" FROM threads WHERE "userIdentifier" = :who OR "userId" = :id'),
            {"who": identifier, "id": user_id or ""},
        )
        return [row[0] for row in rows]


LAST_ACTIVE = 'COALESCE(MAX(s."createdAt"), t."createdAt", \'\')'  # a conversation's last message
IDLE_THREADS = (
    'SELECT t."id" FROM threads t LEFT JOIN steps s ON s."threadId" = t."id" '
    f'GROUP BY t."id", t."createdAt" HAVING {LAST_ACTIVE} < :cutoff LIMIT :batch'
)
EXCESS_THREADS = (
    'SELECT "id" FROM (SELECT t."id", ROW_NUMBER() OVER (PARTITION BY t."userIdentifier" '
    f'ORDER BY {LAST_ACTIVE} DESC, t."id") AS position '
    'FROM threads t LEFT JOIN steps s ON s."threadId" = t."id" '
    'GROUP BY t."id", t."userIdentifier", t."createdAt") ranked WHERE position > :keep LIMIT :batch'
)


async def _delete_selected(
    engine: AsyncEngine,
    query: str,
    params: dict[str, object],
    batches: int | None = None,
    delete: Callable[[AsyncEngine, list[str]], Awaitable[int]] = delete_threads,
) -> int:
    """Delete the conversations `query` selects (or apply another `delete` to them), a batch at a
    time, until it selects none or `batches` batches are done (None: no limit)."""
    deleted = 0
    done = 0
    while batches is None or done < batches:
        async with engine.connect() as connection:
            rows = await connection.execute(text(query), {**params, "batch": DELETE_BATCH})
            ids = [row[0] for row in rows]
        if not ids:
            break
        deleted += await delete(engine, ids)
        done += 1
    return deleted


async def delete_idle_threads(
    engine: AsyncEngine, older_than_days: float, now: datetime | None = None, batches: int | None = None
) -> int:
    """Retention: delete conversations whose last message is older than `older_than_days`.

    Steps left without a conversation (a thread row that failed to save) age out the same way.
    """
    cutoff = timestamp((now or datetime.now(UTC)) - timedelta(days=older_than_days))
    deleted = await _delete_selected(engine, IDLE_THREADS, {"cutoff": cutoff}, batches)
    async with engine.begin() as connection:
        await connection.execute(
            text(
                'DELETE FROM steps WHERE "createdAt" < :cutoff '
                'AND "threadId" NOT IN (SELECT "id" FROM threads)'
            ),
            {"cutoff": cutoff},
        )
        await connection.execute(
            text(
                'DELETE FROM thread_documents WHERE thread_id NOT IN (SELECT "id" FROM threads) '
                "AND created_at < :cutoff"
            ),
            {"cutoff": cutoff},
        )
    return deleted


async def delete_excess_threads(engine: AsyncEngine, keep: int, batches: int | None = None) -> int:
    """The cap: delete each user's conversations beyond the `keep` most recently active ones."""
    return await _delete_selected(engine, EXCESS_THREADS, {"keep": keep}, batches)


OVER_LONG_THREADS = (
    'SELECT "threadId" FROM steps WHERE "type" = \'user_message\' AND "threadId" IS NOT NULL '
    'GROUP BY "threadId" HAVING COUNT(*) > :keep LIMIT :batch'
)
STEP_ROWS = 'SELECT "id", "parentId", "createdAt", "type" FROM steps WHERE "threadId" = :id'


def steps_before_last_turns(rows: list[tuple[str, str | None, str, str]], keep: int) -> list[str]:
    """Ids of the steps older than the last `keep` turns (a turn starts at a user message), with every
    step under them: rows are (id, parentId, createdAt, type) of one conversation."""
    starts = sorted((at or "", step) for step, _, at, kind in rows if kind == "user_message")
    if len(starts) <= keep:
        return []
    dropped_starts = {step for _, step in starts[: len(starts) - keep]}
    cut = starts[len(starts) - keep][0]
    doomed = {step for step, _, at, kind in rows if (at or "") < cut and kind != "user_message"}
    doomed |= dropped_starts
    while grown := {step for step, parent, _, _ in rows if parent in doomed and step not in doomed}:
        doomed |= grown  # an answer that began after the cut goes with the turn it answers
    return sorted(doomed)


async def trim_long_threads(engine: AsyncEngine, keep: int, batches: int | None = None) -> int:
    """The length cap: delete each conversation's turns before its last `keep` (their answers,
    feedback and elements with them), a batch of conversations per transaction; return how many
    conversations were trimmed."""
    return await _delete_selected(
        engine, OVER_LONG_THREADS, {"keep": keep}, batches, delete=partial(_trim_threads, keep=keep)
    )


async def _trim_threads(engine: AsyncEngine, thread_ids: list[str], keep: int) -> int:
    async with engine.begin() as connection:
        for thread_id in thread_ids:
            steps = (await connection.execute(text(STEP_ROWS), {"id": thread_id})).all()
            doomed = steps_before_last_turns([tuple(row) for row in steps], keep)  # type: ignore[misc]
            for start in range(0, len(doomed), DELETE_BATCH):
                await _delete_steps(connection, thread_id, doomed[start : start + DELETE_BATCH])
    return len(thread_ids)


async def _delete_steps(connection: AsyncConnection, thread_id: str, step_ids: list[str]) -> None:
    await _execute_for_ids(
        connection,
        step_ids,
        (
            'DELETE FROM feedbacks WHERE "forId" IN :ids',
            'DELETE FROM elements WHERE "threadId" = :thread AND "forId" IN :ids',
            'DELETE FROM steps WHERE "id" IN :ids',
        ),
        thread=thread_id,
    )


async def owner_of_step(engine: AsyncEngine, step_id: str) -> str | None:
    """The user whose conversation holds this message, or None."""
    async with engine.connect() as connection:
        row = (
            await connection.execute(
                text(
                    'SELECT t."userIdentifier" FROM steps s JOIN threads t ON t."id" = s."threadId" '
                    'WHERE s."id" = :id'
                ),
                {"id": step_id},
            )
        ).first()
    return None if row is None else row[0]


async def owner_of_feedback(engine: AsyncEngine, feedback_id: str) -> tuple[bool, str | None]:
    """(the feedback exists, the user whose message it is about)."""
    async with engine.connect() as connection:
        row = (
            await connection.execute(
                text(
                    'SELECT t."userIdentifier" FROM feedbacks f LEFT JOIN steps s ON s."id" = f."forId" '
                    'LEFT JOIN threads t ON t."id" = s."threadId" WHERE f."id" = :id'
                ),
                {"id": feedback_id},
            )
        ).first()
    return (False, None) if row is None else (True, row[0])
