"""A stored conversation cut back to a branch point: an edited message keeps its place and gets its
new text, and everything stored after it goes (answers, notices, their feedback and elements); a
regenerated answer goes with everything after it, from the run it belongs to (Chainlit makes a run
step under the user's message, and the answer inside it). A conversation named after the edited message (as
Chainlit names it after its first one) takes the new text as its name, so the old text is nowhere.

Stored messages are ordered by `createdAt` (Chainlit's UTC ISO text, which sorts as time). Every
statement names the conversation, so a step id from a client never reaches another one's rows.
"""

from __future__ import annotations

from sqlalchemy import Row, text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

OWNED_USER_MESSAGE = (
    'SELECT 1 FROM steps s JOIN threads t ON t."id" = s."threadId" WHERE s."id" = :id '
    'AND s."threadId" = :thread AND s."type" = \'user_message\' AND t."userIdentifier" = :who'
)
# The steps cut: from the branch point's time on, in its conversation; {keep} spares the point itself.
CUT = 'FROM steps WHERE "threadId" = :thread AND "createdAt" >= :at{keep}'
KEEP_POINT = ' AND "id" <> :id'


async def user_message_owned(engine: AsyncEngine, thread_id: str, user: str, step_id: str) -> bool:
    """Whether `step_id` is a message `user` sent, stored in their conversation `thread_id`."""
    async with engine.connect() as connection:
        found = await connection.execute(
            text(OWNED_USER_MESSAGE), {"id": step_id, "thread": thread_id, "who": user}
        )
        return found.first() is not None


async def _point(connection: AsyncConnection, thread_id: str, step_id: str, keep_step: bool) -> Row | None:
    """The step to cut from ("id", "createdAt", "output"): `step_id`, or the run it belongs to when
    it goes itself (an answer and its run); None when it is not stored in this conversation."""
    where = 'FROM steps WHERE "id" = :id AND "threadId" = :thread'
    found = (
        await connection.execute(
            text(f'SELECT "id", "createdAt", "output", "parentId" {where}'),
            {"id": step_id, "thread": thread_id},
        )
    ).first()
    if found is None or keep_step or not found[3]:
        return found
    run = (
        await connection.execute(
            text(f'SELECT "id", "createdAt", "output" {where} AND "type" = \'run\''),
            {"id": found[3], "thread": thread_id},
        )
    ).first()
    return run or found


async def point(engine: AsyncEngine, thread_id: str, step_id: str, keep_step: bool) -> tuple[str, str] | None:
    """The step a cut starts from and its time (see `_point`); None when there is none to cut."""
    async with engine.connect() as connection:
        found = await _point(connection, thread_id, step_id, keep_step)
    return (found[0], found[1]) if found is not None and found[1] else None


async def cut(
    engine: AsyncEngine, thread_id: str, step_id: str, keep_step: bool, new_text: str | None, name_chars: int
) -> list[str]:
    """Delete the conversation's steps from `step_id` on (after it when `keep_step`, which then gets
    `new_text`; names are cut to `name_chars`), with their feedback and elements, in one transaction;
    return the ids deleted (none when `step_id` is not stored in this conversation)."""
    async with engine.begin() as connection:
        point = await _point(connection, thread_id, step_id, keep_step)
        if point is None or not point[1]:
            return []
        where = CUT.format(keep=KEEP_POINT if keep_step else "")
        bound = {"id": point[0], "thread": thread_id, "at": point[1]}
        ids = [found[0] for found in await connection.execute(text(f'SELECT "id" {where}'), bound)]
        for table in ("feedbacks", "elements"):
            owned = f'DELETE FROM {table} WHERE "forId" IN (SELECT "id" {where})'
            await connection.execute(text(owned), bound)
        await connection.execute(text(f"DELETE {where}"), bound)
        if keep_step and new_text is not None:
            await connection.execute(
                text('UPDATE steps SET "output" = :output WHERE "id" = :id AND "threadId" = :thread'),
                {**bound, "output": new_text},
            )
            renamed = {
                "thread": thread_id,
                "old": (point[2] or "")[:name_chars],
                "new": new_text[:name_chars],
            }
            await connection.execute(
                text('UPDATE threads SET "name" = :new WHERE "id" = :thread AND "name" = :old'), renamed
            )
        return ids
