"""The history of one process: database engine, Chainlit data layer, migrations, the recovery probe,
retention, and restoring a stored conversation into a session."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from datetime import UTC, datetime
from typing import Any

from prometheus_client import Counter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import text

from services.audit.log import AuditLog
from services.chat import branch
from services.chat.session import ChatSession, SessionDocument
from services.chat.store import SessionStore
from services.config import Settings
from services.history import branches, conversations
from services.history.data_layer import ChatDataLayer
from services.history.database import create_engine, file_size_bytes, sqlite_memory_bytes, sqlite_path
from services.history.health import HistoryHealth
from services.history.migrations import migrate
from services.history.resume import chat_settings_of, turns_from_steps
from services.history.thread_list import MAX_THREAD_NAME_CHARS

logger = logging.getLogger(__name__)

RETENTION_BATCHES_PER_ROUND = 1  # batches of DELETE_BATCH conversations each rule deletes per round
FAILED = object()  # what a guarded database operation returns when it failed


class History:
    """The database for the life of the process: conversations (when `keep_conversations`) and the
    accounts that live beside them (when `use_database`)."""

    def __init__(self, settings: Settings, keep_conversations: bool, use_database: bool) -> None:
        self.settings = settings
        self.enabled = keep_conversations
        self.health = HistoryHealth()
        self.feedback = Counter(
            "chat_feedback", "Feedback given on answers, by value.", ["value"], registry=None
        )
        self.engine = create_engine(settings) if use_database or keep_conversations else None
        self.audit = AuditLog(self.engine, settings) if self.engine is not None else None  # audit_log
        self.layer = (
            ChatDataLayer(self.engine, self.health, self.feedback, settings, self.audit)
            if self.enabled and self.engine
            else None
        )
        self.migrated = False
        self.retention_deleted_total = 0
        self._ready_callbacks: list[Callable[[], Awaitable[None]]] = []
        self._retention_at: float | None = None
        self._sweep_unfinished = False  # the last round deleted full batches: the next one goes on
        self._probe: asyncio.Task | None = None

    @property
    def available(self) -> bool:
        """True while conversations are being saved."""
        return self.enabled and self.migrated and self.health.available

    @property
    def database_state(self) -> str:
        """The database for readiness: "none" (there is none), "reachable" (as far as the last
        statement knew), "fallback" (down: chat goes on unsaved and each replica counts its own limits
        while the probe retries) or "lost" (down and nothing retries: not started, stopped, or the
        probe ended)."""
        if self.engine is None:
            return "none"
        if self.migrated and self.health.available:
            return "reachable"
        return "fallback" if self._probe is not None and not self._probe.done() else "lost"

    def on_ready(self, callback: Callable[[], Awaitable[None]]) -> None:
        """Run `callback` once the schema is in place (at start, or when the database comes back)."""
        self._ready_callbacks.append(callback)

    async def start(self) -> None:
        """Migrate (or note the database is down and keep trying), then start the recovery probe."""
        if self.engine is None:
            return
        await self._migrate()
        self._probe = asyncio.create_task(self._probe_loop(), name="history-probe")

    async def stop(self) -> None:
        if self._probe is not None:
            self._probe.cancel()
            await asyncio.gather(self._probe, return_exceptions=True)
            self._probe = None
        if self.engine is not None:
            await self.engine.dispose()

    async def _migrate(self) -> bool:
        assert self.engine is not None
        try:
            applied = await migrate(self.engine)
        except Exception as error:
            self.health.failed(error, outage=True)
            logger.warning(
                "history: schema not ready (%s); retrying every %.0f s",
                error,
                self.settings.history_retry_seconds,
            )
            return False
        self.migrated = True
        self.health.recovered()
        logger.info("history: schema up to date%s", f" (applied {applied})" if applied else "")
        for callback in self._ready_callbacks:
            try:
                await callback()
            except Exception:
                logger.exception("history: a start-up step failed")
        return True

    async def _probe_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.history_retry_seconds)
            if not self.migrated:
                await self._migrate()
            elif not self.health.available and await self._write_probe():
                self.health.recovered()

    async def _write_probe(self) -> bool:
        """A one-row write: it fails on a locked, full, read-only or unreachable database."""
        assert self.engine is not None
        try:
            async with self.engine.begin() as connection:
                await connection.execute(
                    text("UPDATE service_health SET checked_at = :now WHERE id = 1"),
                    {"now": conversations.timestamp(datetime.now(UTC))},
                )
            return True
        except Exception:
            return False

    # --- conversations ---------------------------------------------------------
    async def restore(self, sessions: SessionStore, session: ChatSession, thread: Mapping[str, Any]) -> None:
        """Rebuild `session` from a stored conversation: document, history, chat settings."""
        thread_id = str(thread.get("id"))
        if self.available:
            stored = await self._guarded(conversations.load_document(self.engine, thread_id))  # type: ignore[arg-type]
            if isinstance(stored, conversations.StoredDocument):
                session.document = SessionDocument(stored.name, stored.text, stored.tokens)
        name = session.document.name if session.document else None
        stored = turns_from_steps(thread.get("steps") or [], self.settings.max_message_chars, name)
        branch.restore(session, stored)
        sessions.update_settings(session, chat_settings_of(thread))

    async def owns_user_message(self, thread_id: str, user: str | None, step_id: str) -> bool:
        """Whether `step_id` is a stored message `user` sent in their conversation `thread_id`."""
        if not self.available or not user:
            return False
        owned = await self._guarded(branches.user_message_owned(self.engine, thread_id, user, step_id))  # type: ignore[arg-type]
        return owned is True

    async def cut_branch(
        self, thread_id: str, step_id: str, keep_step: bool, text: str | None
    ) -> list[str] | None:
        """Delete the stored messages from `step_id` on (branches.py), once the writes already under
        way to this conversation (an answer just aborted) have landed; None when history is down."""
        if not self.enabled:
            return []
        if not self.available or self.layer is None:
            return None
        # The message may have been sent a moment ago: its write lands before its place is looked up.
        await self.layer.writes_done(thread_id, self.settings.database_timeout_seconds)
        found = await self._guarded(branches.point(self.engine, thread_id, step_id, keep_step))  # type: ignore[arg-type]
        if found is FAILED or found is None:
            return None if found is FAILED else []
        until = conversations.timestamp(datetime.now(UTC))
        self.layer.fence(thread_id, found[0] if keep_step else None, found[1], until)
        await self.layer.writes_done(thread_id, self.settings.database_timeout_seconds)
        names = MAX_THREAD_NAME_CHARS
        cut = await self._guarded(branches.cut(self.engine, thread_id, step_id, keep_step, text, names))  # type: ignore[arg-type]  # type: ignore[arg-type]
        return None if cut is FAILED else cut

    def notice_for(self, session: ChatSession) -> str | None:
        """What to tell this session about saving: once per outage, and once when it is over."""
        if not self.enabled:
            return None
        if not self.available and session.history_outage_told != self.health.outage:
            session.history_outage_told = self.health.outage
            return self.health.message
        if self.available and session.history_outage_told:
            session.history_outage_told = 0
            return "Chat history is back: new messages are saved again."
        return None

    async def save_document(self, thread_id: str, document: SessionDocument) -> bool:
        """Keep the session's document with its conversation; False when it could not be saved."""
        if not self.available:
            return False
        stored = conversations.StoredDocument(document.name, document.text, document.tokens)
        return await self._guarded(conversations.save_document(self.engine, thread_id, stored)) is not FAILED  # type: ignore[arg-type]

    async def delete_conversations_of(self, identifier: str) -> int:
        assert self.engine is not None
        ids = await conversations.thread_ids_of_user(self.engine, identifier)
        return await conversations.delete_threads(self.engine, ids)

    async def retention_round(self) -> int:
        """Delete conversations idle past HISTORY_RETENTION_DAYS and each user's beyond
        HISTORY_MAX_CONVERSATIONS, and trim conversations to their last HISTORY_MAX_TURNS turns
        (a maintenance round calls it); return how many conversations it deleted.

        A sweep starts every HISTORY_RETENTION_INTERVAL_SECONDS and goes a batch per rule per
        round until a round finds less than a batch, so the excess goes in small transactions
        spread over rounds: chat saves wait for the write lock one batch at a time, not for the
        whole sweep.
        """
        rules = self._retention_rules()
        now = time.monotonic()
        interval = conversations.HISTORY_RETENTION_INTERVAL_SECONDS
        due = self._retention_at is None or now - self._retention_at >= interval
        enabled = any(rule[0] for rule in rules) and self.available
        if not enabled or not (due or self._sweep_unfinished):
            return 0
        if due:
            self._retention_at = now
        total = 0
        unfinished = False
        batches = RETENTION_BATCHES_PER_ROUND
        for limit, sweep, what, deletes in rules:
            done = await self._guarded(sweep(self.engine, limit, batches=batches)) if limit else 0  # type: ignore[arg-type, operator]
            if done is FAILED or not done:
                continue
            total += done if deletes else 0
            unfinished = unfinished or done >= batches * conversations.DELETE_BATCH
            logger.info("retention: " + what, done, limit)
        self._sweep_unfinished = unfinished
        self.retention_deleted_total += total
        return total

    def _retention_rules(self) -> tuple[tuple[float, Callable[..., Awaitable[int]], str, bool], ...]:
        """(limit, sweep, log message, whether it deletes whole conversations) of each retention rule."""
        settings = self.settings
        return (
            (
                settings.history_retention_days,
                conversations.delete_idle_threads,
                "deleted %d conversation(s) idle for more than %g days",
                True,
            ),
            (
                settings.history_max_conversations,
                conversations.delete_excess_threads,
                "deleted %d conversation(s) beyond %g per user",
                True,
            ),
            (
                settings.history_max_turns,
                conversations.trim_long_threads,
                "trimmed %d conversation(s) to their last %g turns",
                False,
            ),
        )

    async def _guarded(self, operation: Awaitable[Any]) -> Any:
        """Run a database operation; a failure feeds the breaker and gives FAILED."""
        try:
            return await operation
        except Exception as error:
            self.health.failed(error)
            logger.warning("history operation failed: %s", error)
            return FAILED

    def status(self) -> dict[str, Any]:
        """For /status: whether conversations are being saved, and why not."""
        if not self.enabled:
            return {"enabled": False}
        path = sqlite_path(self.settings)
        return {
            "enabled": True,
            "available": self.available,
            "reason": self.health.reason,
            "database": "sqlite" if path else "postgresql",
            "database_bytes": file_size_bytes(path) if path and path.exists() else None,
            "sqlite_memory_bytes": sqlite_memory_bytes() if path else None,
            "failed_statements_total": self.health.failures_total,
            "outages_total": self.health.outage,
        }


class HistoryCollector(Collector):
    """`chat_history_*` gauges and counters and `chat_feedback_total` for /metrics."""

    def __init__(self, history: History) -> None:
        self._history = history

    def collect(self) -> Iterator[Metric]:
        history = self._history
        yield from history.feedback.collect()
        if not history.enabled:
            return
        yield GaugeMetricFamily(
            "chat_history_available", "1 while conversations are being saved.", value=float(history.available)
        )
        for name, doc, value in (
            (
                "chat_history_failed_statements",
                "Database statements that failed.",
                history.health.failures_total,
            ),
            (
                "chat_history_skipped_statements",
                "Statements skipped while the database was down.",
                history.health.skipped_total,
            ),
            ("chat_history_outages", "Times the database became unavailable.", history.health.outage),
            (
                "chat_history_retention_deleted",
                "Conversations deleted by retention and the per-user cap.",
                history.retention_deleted_total,
            ),
        ):
            yield CounterMetricFamily(name, doc, value=value)
        status = history.status()
        for name, doc in (
            ("database_bytes", "Size of the SQLite database files."),
            ("sqlite_memory_bytes", "Heap bytes SQLite holds in this process (page caches, statements)."),
        ):
            if status.get(name) is not None:
                yield GaugeMetricFamily(f"chat_history_{name}", doc, value=status[name])
