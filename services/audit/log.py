"""The audit log: one append-only table (`audit_log`), written by sign-in, the accounts command, the
admin page, the chat's /key and the conversation deletions; read by the admin page and the
accounts command.

Entries are only ever inserted; the one statement that deletes is retention (`retention_round`:
older than AUDIT_RETENTION_DAYS, and the oldest beyond AUDIT_MAX_ROWS). There is no update. What
an entry holds is cut and scrubbed on the way in (details.py); action names are in actions.py.
Writing is one short INSERT in its own transaction: sign-in and the admin's actions await it;
`record_soon` hands it to a background task for callers that must not wait. A write that fails is
logged and dropped: the audit log never stops the action it records.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from services.audit.details import (
    ACTION_CHARS,
    ACTOR_CHARS,
    ADDRESS_CHARS,
    AUDIT_DETAILS_MAX_BYTES,
    TARGET_CHARS,
    details_json,
    short,
)
from services.audit.filters import AuditFilter, timestamp
from services.config import Settings

logger = logging.getLogger(__name__)

DELETE_BATCH = 1000  # rows one retention statement deletes
BATCHES = 20  # statements per rule per retention round at most
MAX_PENDING = 1000  # background writes in flight at most (record_soon); more are dropped and logged
RETENTION_INTERVAL_SECONDS = 300.0  # how often the retention rules run: as the history's sweeps
COLUMNS = ("at", "actor", "action", "target", "address", "details")


@dataclass(frozen=True)
class AuditEntry:
    at: str
    actor: str
    action: str
    target: str
    address: str
    details: str  # JSON text

    def row(self) -> tuple[str, ...]:
        return (self.at, self.actor, self.action, self.target, self.address, self.details)


class AuditLog:
    """Appends entries, lists them by filter, and applies retention; one per process."""

    def __init__(self, engine: AsyncEngine, settings: Settings) -> None:
        self.engine = engine
        self.settings = settings
        self.written_total = 0
        self.failed_total = 0
        self.dropped_total = 0
        self._pending: set[asyncio.Task] = set()
        self._retention_at: float | None = None

    async def record(
        self,
        actor: str | None,
        action: str,
        target: str | None = None,
        details: Mapping[str, Any] | None = None,
        address: str | None = None,
    ) -> bool:
        """Append one entry; False (logged) when it could not be written."""
        values = {
            "id": uuid.uuid4().hex,
            "at": timestamp(datetime.now(UTC)),
            "actor": short(actor, ACTOR_CHARS) or "-",
            "action": short(action, ACTION_CHARS),
            "target": short(target, TARGET_CHARS),
            "address": short(address, ADDRESS_CHARS),
            "details": details_json(details, AUDIT_DETAILS_MAX_BYTES),
        }
        try:
            async with self.engine.begin() as connection:
                await connection.execute(
                    text(
                        "INSERT INTO audit_log (id, at, actor, action, target, address, details) "
                        "VALUES (:id, :at, :actor, :action, :target, :address, :details)"
                    ),
                    values,
                )
        except Exception as error:
            self.failed_total += 1
            logger.warning(
                "audit: could not record %s by %s: %s",
                values["action"],
                values["actor"],
                type(error).__name__,
            )
            return False
        self.written_total += 1
        return True

    def record_soon(
        self,
        actor: str | None,
        action: str,
        target: str | None = None,
        details: Mapping[str, Any] | None = None,
        address: str | None = None,
    ) -> None:
        """`record` in a background task: the caller does not wait for the database."""
        if len(self._pending) >= MAX_PENDING:
            self.dropped_total += 1
            logger.warning("audit: %d writes pending; dropped %s by %s", MAX_PENDING, action, actor)
            return
        task = asyncio.create_task(self.record(actor, action, target, details, address), name="audit-write")
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def flush(self) -> None:
        """Wait for the background writes in flight (at shutdown, and in tests)."""
        if self._pending:
            await asyncio.gather(*list(self._pending), return_exceptions=True)

    async def entries(self, chosen: AuditFilter, limit: int) -> list[AuditEntry]:
        """The newest `limit` entries that match, newest first."""
        where, values = chosen.where()
        query = f"SELECT {', '.join(COLUMNS)} FROM audit_log{where} ORDER BY at DESC, id DESC LIMIT :limit"
        async with self.engine.connect() as connection:
            rows = await connection.execute(text(query), {**values, "limit": int(limit)})
            return [AuditEntry(*(value or "" for value in row)) for row in rows]

    async def retention_round(self) -> int:
        """Delete entries past AUDIT_RETENTION_DAYS and the oldest beyond AUDIT_MAX_ROWS, a batch per
        rule, every RETENTION_INTERVAL_SECONDS (a maintenance round calls it); how many went."""
        s = self.settings
        now = time.monotonic()
        if self._retention_at is not None and now - self._retention_at < RETENTION_INTERVAL_SECONDS:
            return 0
        self._retention_at = now
        deleted = 0
        try:
            if s.audit_retention_days:
                cut = timestamp(datetime.now(UTC) - timedelta(days=s.audit_retention_days))
                deleted += await self._delete_oldest("WHERE at < :cut", {"cut": cut}, BATCHES * DELETE_BATCH)
            if s.audit_max_rows and (excess := await self._count() - s.audit_max_rows) > 0:
                deleted += await self._delete_oldest("", {}, min(excess, BATCHES * DELETE_BATCH))
        except Exception as error:
            logger.warning("audit: retention failed: %s", type(error).__name__)
            self._retention_at = None  # try again next round
        if deleted:
            logger.info("audit: retention deleted %d entr%s", deleted, "y" if deleted == 1 else "ies")
        return deleted

    async def _count(self) -> int:
        async with self.engine.connect() as connection:
            return int((await connection.execute(text("SELECT COUNT(*) FROM audit_log"))).scalar() or 0)

    async def _delete_oldest(self, where: str, values: dict[str, Any], most: int) -> int:
        """Delete up to `most` of the oldest entries that match, a batch per short transaction."""
        deleted = 0
        while deleted < most:
            batch = min(DELETE_BATCH, most - deleted)
            async with self.engine.begin() as connection:
                result = await connection.execute(
                    text(
                        "DELETE FROM audit_log WHERE id IN "
                        f"(SELECT id FROM audit_log {where} ORDER BY at, id LIMIT :count)"
                    ),
                    {**values, "count": batch},
                )
            done = result.rowcount or 0
            deleted += done
            if done < batch:
                break
        return deleted
