"""Chainlit's SQLAlchemyDataLayer, made safe for SQLite, for PostgreSQL and for a database in trouble.

What this subclass changes, and why:
- statements go through the breaker (health.py): while the database is down they are skipped at
  once, and a statement that fails opens the breaker instead of being logged and forgotten;
- at most STATEMENT_SLOTS statements run at once and the rest wait their turn here: a burst of
  people arriving together (the soak's first seconds) no longer waits out the connection pool's
  timeout, which counted as an outage and left their first messages unsaved;
- a write made of several statements (a thread upsert that first reads the thread, a step that
  first upserts its thread, a delete of four tables) stops at its first failed statement, so a
  read that failed is never mistaken for "no such row" and followed by a write that overwrites it;
- lists and dicts are bound as JSON text (SQLite cannot bind a list: Chainlit issue #2528) and
  thread tags are read back as lists;
- thread ids must be UUIDs: Chainlit takes the id a browser sends for a new conversation and
  later pastes stored ids into an `IN ('...')` list, so an id with a quote would be SQL;
- a step is only ever updated within its own conversation (`step_upsert`): the browser chooses a
  user message's id, so Chainlit's upsert let anyone move another person's message into their own;
- a conversation and its steps are written only while the account writing them exists
  (`owned_writes`): what a removed account still had under way is not stored;
- the writes under way to each conversation are counted, so cutting it back (an edit, a regenerate:
  branches.py) waits for an aborted answer's last write, which Chainlit sends as a task of its own,
  and a write of a step of the cut branch that comes later still is dropped (`fence`);
- deleting a conversation also deletes its stored document and its share links and is recorded in
  the audit log; new feedback is counted for /metrics;
- a conversation's name is cut to MAX_THREAD_NAME_CHARS (Chainlit names a conversation after its
  first message), and the sidebar's list is one bounded statement per page that loads no messages
  (thread_list.py); its search goes through the full-text index (thread_search.py).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import json
import logging
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from chainlit.data.sql_alchemy import SQLAlchemyDataLayer
from chainlit.data.utils import queue_until_user_message
from chainlit.types import Feedback, PaginatedResponse, Pagination, ThreadFilter
from prometheus_client import Counter
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession
from sqlalchemy.orm import sessionmaker

from services.audit import actions
from services.audit.log import AuditLog
from services.config import Settings
from services.history import search_snippets, thread_list, thread_search
from services.history.database import POOL_SIZE
from services.history.health import HistoryHealth, _first_line
from services.history.owned_writes import (
    Statement,
    Writer,
    current_writer,
    live_writer,
    merged_metadata,
    thread_upsert,
)
from services.history.step_upsert import step_upsert
from services.history.thread_list import MAX_THREAD_NAME_CHARS

logger = logging.getLogger(__name__)

USER_THREAD_LIMIT = 1000  # conversations listed per user at most (Chainlit's own default)
# Connections Chainlit's statements may hold at once: the pool's kept ones, so a burst never opens
# and closes overflow connections (a new PostgreSQL backend each); the overflow stays free for
# sign-in, the breaker's probe and maintenance, so none of those waits behind a burst of saves.
STATEMENT_SLOTS = POOL_SIZE
USER_NAME = 'SELECT "identifier" FROM users WHERE "id" = :id'
THREAD_METADATA = 'SELECT "metadata" FROM threads WHERE "id" = :id'
MAX_FENCES = 1000  # cut conversations whose late writes are still dropped (the oldest cut goes first)


@dataclass
class _Unit:
    failed: bool = False


_UNIT: contextvars.ContextVar[_Unit | None] = contextvars.ContextVar("history_unit", default=None)


@contextlib.contextmanager
def _unit_of_work() -> Iterator[_Unit]:
    """Statements inside stop at the first failure (nested units join the outer one)."""
    outer = _UNIT.get()
    if outer is not None:
        yield outer
        return
    unit = _Unit()
    token = _UNIT.set(unit)
    try:
        yield unit
    finally:
        _UNIT.reset(token)


def is_uuid(value: Any) -> bool:
    try:
        return isinstance(value, str) and str(uuid.UUID(value)) == value.lower()
    except ValueError:
        return False


def _sortable(at: str) -> str:
    """A Chainlit time that compares as text: `isoformat` leaves out a zero microsecond part."""
    return at[:-1] + ".000000Z" if at.endswith("Z") and "." not in at[-8:] else at


def _bindable(value: Any) -> Any:
    return json.dumps(value) if isinstance(value, list | tuple | dict) else value


class ChatDataLayer(SQLAlchemyDataLayer):
    """The data layer registered with `@cl.data_layer` (one per process, over the history's engine)."""

    def __init__(
        self,
        engine: AsyncEngine,
        health: HistoryHealth,
        feedback: Counter,
        settings: Settings,
        audit: AuditLog | None = None,
    ) -> None:
        # Not super().__init__: it would build a second engine without our timeouts and pool.
        self._conninfo = engine.url.render_as_string(hide_password=True)
        self.user_thread_limit = USER_THREAD_LIMIT
        self.show_logger = False
        self.storage_provider = None  # uploads are not stored; a document's text is (thread_documents)
        self.engine = engine
        self.async_session = sessionmaker(bind=engine, expire_on_commit=False, class_=AsyncSession)  # type: ignore[call-overload]
        self.health = health
        self.feedback = feedback
        self.settings = settings
        self.audit = audit
        self._slots = asyncio.Semaphore(STATEMENT_SLOTS)
        self._writing: collections.Counter[str] = collections.Counter()  # conversation -> writes under way
        self._fences: collections.OrderedDict[str, tuple[str | None, str, str]] = collections.OrderedDict()

    async def execute_sql(self, query: str, parameters: dict) -> list[dict[str, Any]] | int | None:
        """Chainlit's execute_sql (rows, a row count, or None on failure), through the breaker."""
        async with self._slots:  # the breaker is read after the wait: it may have opened meanwhile
            return await self._execute([(query, parameters)])

    async def _write_owned(self, statements: list[Statement], writer: Writer | None) -> None:
        """`statements` in one transaction, kept only while `writer`'s account exists (owned_writes.py)."""
        async with self._slots:
            await self._execute(statements, writer)

    async def _execute(
        self, statements: list[Statement], writer: Writer | None = None
    ) -> list[dict[str, Any]] | int | None:
        """The statements in one transaction (rolled back when `writer` may no longer write); the last
        one's rows or row count, or None on failure."""
        unit = _UNIT.get()
        if (unit is not None and unit.failed) or not self.health.available:
            self.health.skipped_total += 1
            if unit is not None:
                unit.failed = True
            return None
        async with self.async_session() as session:
            try:
                for query, parameters in statements:
                    bound = {key: _bindable(value) for key, value in parameters.items()}
                    result = await session.execute(text(query), bound)
                if writer is not None and not await self._may_write(session, writer):
                    await session.rollback()
                    return 0
                await session.commit()
                if result.returns_rows:
                    return self.clean_result([dict(row._mapping) for row in result.fetchall()])
                return result.rowcount
            except Exception as error:
                with contextlib.suppress(Exception):
                    await session.rollback()
                self.health.failed(error)
                if unit is not None:
                    unit.failed = True
                logger.warning("history statement failed: %s", _first_line(error))
                return None

    async def _may_write(self, session: AsyncSession, writer: Writer) -> bool:
        query = text(live_writer(self.engine.dialect.name))
        if (await session.execute(query, {"writer": writer.user_id})).first() is not None:
            return True
        logger.info("a write of %s's conversation was not stored: the account was removed", writer.identifier)
        return False

    async def update_thread(
        self,
        thread_id: str,
        name: str | None = None,
        user_id: str | None = None,
        metadata: dict | None = None,
        tags: list[str] | None = None,
    ) -> None:
        """Chainlit's thread upsert, written only while its writer's account exists (owned_writes.py)."""
        if not is_uuid(thread_id):
            logger.warning("refused to store a conversation whose id is not a UUID: %r", thread_id[:80])
            return
        if isinstance(name, str):  # Chainlit names a conversation after its first message
            name = name[:MAX_THREAD_NAME_CHARS]
        with _unit_of_work():
            owner = None
            if user_id:
                rows = await self.execute_sql(USER_NAME, {"id": user_id})
                if not rows or not isinstance(rows, list):  # unavailable, or the row is gone (removed)
                    return
                owner = Writer(user_id, rows[0]["identifier"])
            stored = await self.execute_sql(THREAD_METADATA, {"id": thread_id})
            if not isinstance(stored, list) or (stored and (name, user_id, metadata, tags) == (None,) * 4):
                return
            merged = merged_metadata(stored[0]["metadata"] if stored else None, metadata)
            values = {
                "createdAt": None if stored else await self.get_current_timestamp(),
                "name": name if name is not None else merged.get("name"),
                "tags": tags,
                "metadata": json.dumps(merged),
            }
            writer = current_writer()
            await self._write_owned([thread_upsert(thread_id, values, owner, writer)], writer)

    @queue_until_user_message()
    async def create_step(self, step_dict: Any) -> None:
        thread_id = step_dict.get("threadId")
        if not is_uuid(thread_id) or self._fenced(step_dict):
            return
        self._writing[thread_id] += 1
        try:
            with _unit_of_work():
                await self.update_thread(thread_id)
                await self._write_owned([step_upsert(step_dict)], current_writer())
        finally:
            self._writing[thread_id] -= 1
            if not self._writing[thread_id]:
                del self._writing[thread_id]

    def fence(self, thread_id: str, kept_id: str | None, since: str, until: str) -> None:
        """From now on, drop writes of this conversation's steps created from `since` to before `until`
        (a cut branch: an aborted answer's late update would bring it back), except `kept_id`."""
        self._fences[thread_id] = (kept_id, since, until)
        self._fences.move_to_end(thread_id)
        while len(self._fences) > MAX_FENCES:
            self._fences.popitem(last=False)

    def _fenced(self, step: dict[str, Any]) -> bool:
        fence = self._fences.get(step.get("threadId") or "")
        at = step.get("createdAt")
        if fence is None or step.get("id") == fence[0] or not isinstance(at, str):
            return False
        return _sortable(fence[1]) <= _sortable(at) < _sortable(fence[2])

    async def writes_done(self, thread_id: str, timeout_seconds: float) -> None:
        """Wait, at most `timeout_seconds`, until no step is being written to this conversation."""
        await asyncio.sleep(0)  # writes sent as tasks just before start (and count) first
        deadline = asyncio.get_running_loop().time() + timeout_seconds
        while self._writing.get(thread_id) and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.02)

    async def delete_thread(self, thread_id: str) -> None:
        """Chainlit's delete (its route checked the caller owns it), the document too, and an audit
        entry with the owner as actor."""
        owner = await self.get_thread_author(thread_id) if self.audit is not None else ""
        with _unit_of_work() as unit:
            await super().delete_thread(thread_id)
            await self.execute_sql("DELETE FROM thread_documents WHERE thread_id = :id", {"id": thread_id})
            await self.execute_sql("DELETE FROM shares WHERE thread_id = :id", {"id": thread_id})
        if unit.failed:
            raise RuntimeError(
                "The conversation could not be deleted: chat history is unavailable right now."
            )
        if self.audit is not None and owner:
            await self.audit.record(owner, actions.CONVERSATION_DELETED, thread_id, {"via": "page"})

    async def upsert_feedback(self, feedback: Feedback) -> str:
        new = not feedback.id
        with _unit_of_work() as unit:
            feedback_id = await super().upsert_feedback(feedback)
        if unit.failed:
            raise RuntimeError("Your feedback could not be saved: chat history is unavailable right now.")
        if new:
            self.feedback.labels("up" if feedback.value == 1 else "down").inc()
        return feedback_id

    async def get_thread_author(self, thread_id: str) -> str:
        """The conversation's owner; "" for an unknown id, which Chainlit answers with 404 (not 500)."""
        query = 'SELECT "userIdentifier" FROM threads WHERE "id" = :id'
        rows = await self.execute_sql(query, {"id": thread_id})
        if not isinstance(rows, list):
            raise RuntimeError("Chat history is unavailable right now.")
        return (rows[0].get("userIdentifier") or "") if rows else ""

    async def list_threads(self, pagination: Pagination, filters: ThreadFilter) -> PaginatedResponse:
        """One page of the sidebar, in one bounded statement (thread_list.py); empty while the
        database is unavailable, as Chainlit's own."""
        if not filters.userId:
            raise ValueError("userId is required")
        if filters.search:
            return await self._search_threads(pagination, filters)
        page_max = thread_list.THREAD_LIST_PAGE_MAX
        parameters = thread_list.page_parameters(pagination, filters, page_max, MAX_THREAD_NAME_CHARS)
        rows = await self.execute_sql(thread_list.page_statement(pagination, filters), parameters)
        size = thread_list.page_size(pagination, page_max)
        return thread_list.page_response(rows if isinstance(rows, list) else [], size)

    async def _search_threads(self, pagination: Pagination, filters: ThreadFilter) -> PaginatedResponse:
        """The sidebar's search through the full-text index (thread_search.py); a text without a word
        matches nothing."""
        dialect = self.engine.dialect.name
        size = thread_list.page_size(pagination, thread_list.THREAD_LIST_PAGE_MAX)
        words = thread_search.search_words(filters.search or "", thread_search.THREAD_SEARCH_MAX_CHARS)
        if not words or not size:
            return thread_list.page_response([], size)
        parameters = thread_search.search_parameters(dialect, words, pagination, filters, size)
        statement = thread_search.search_statement(dialect, words, pagination, filters)
        rows = await self.execute_sql(statement, parameters)
        rows = rows if isinstance(rows, list) else []
        messages = await self._message_texts([row["best"] for row in rows[:size] if row.get("best")])
        named = search_snippets.with_snippets(rows, messages, words, thread_search.MIN_PREFIX_CHARS)
        return thread_list.page_response(named, size)

    async def _message_texts(self, step_ids: list[Any]) -> dict[str, str]:
        """The texts of these messages (a search page's best matches), by id; none while the
        database cannot answer."""
        if not step_ids:
            return {}
        names = {f"m{index}": str(step_id) for index, step_id in enumerate(step_ids)}
        listed = ", ".join(f":{name}" for name in names)
        rows = await self.execute_sql(f'SELECT "id", "output" FROM steps WHERE "id" IN ({listed})', names)
        listed_rows = rows if isinstance(rows, list) else []
        return {str(row["id"]): row["output"] for row in listed_rows if isinstance(row.get("output"), str)}

    async def step_exists(self, step_id: str) -> bool:
        """True when a message with this id is stored (False too when the database cannot say)."""
        rows = await self.execute_sql('SELECT 1 AS found FROM steps WHERE "id" = :id', {"id": step_id})
        return bool(rows) and isinstance(rows, list)

    async def get_all_user_threads(self, user_id: str | None = None, thread_id: str | None = None) -> Any:
        threads = await super().get_all_user_threads(user_id=user_id, thread_id=thread_id)
        for thread in threads or []:
            if isinstance(thread.get("tags"), str):  # stored as JSON text (see _bindable)
                with contextlib.suppress(ValueError):
                    thread["tags"] = json.loads(thread["tags"])
        return threads

    async def close(self) -> None:
        """The history owns the engine and disposes of it; Chainlit must not."""
