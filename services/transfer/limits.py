"""How much one person may import, and how many imports run at once.

In this process (memory): one import at a time per person, and at most IMPORT_MAX_RUNNING of
everyone's. In the database (the `imports` table, so replicas on one database count the same rows):
IMPORT_MAX_PER_HOUR and IMPORT_MAX_PER_DAY imports started (a refused file counts: it was read),
and IMPORT_MAX_MESSAGES_PER_DAY and IMPORT_MAX_STORED_BYTES_PER_DAY stored, counted against the day
before anything is stored. A refusal is ImportLimited: a sentence for the person, and when to try
again. Days are UTC days; rows older than two days are deleted as the person's next import starts.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from services.config import Settings
from services.transfer.archive import BadImport
from services.transfer.reading import ImportRead

KEPT_FOR = timedelta(days=2)  # rows older than this count for nothing
RUNNING_RETRY_SECONDS = 60  # what a refusal for imports running now suggests


class ImportLimited(BadImport):
    """An import refused by a limit of the person's or the server's, not by its file."""

    def __init__(self, message: str, retry_after_seconds: float) -> None:
        super().__init__(message)
        self.retry_after_seconds = max(1, int(retry_after_seconds + 0.999))


@dataclass(frozen=True)
class ImportQuota:
    per_hour: int
    per_day: int
    messages_per_day: int
    bytes_per_day: int
    running: int

    @classmethod
    def from_settings(cls, settings: Settings) -> ImportQuota:
        return cls(
            settings.import_max_per_hour,
            settings.import_max_per_day,
            settings.import_max_messages_per_day,
            settings.import_max_stored_bytes_per_day,
            settings.import_max_running,
        )


@dataclass(frozen=True)
class Ticket:
    """One admitted import: its row in `imports`."""

    id: str
    owner: str
    started_at: datetime


def utc_now() -> datetime:
    return datetime.now(UTC)


def _stamp(at: datetime) -> str:
    return at.astimezone(UTC).isoformat(timespec="microseconds")  # fixed width: compares as text


def _day_start(at: datetime) -> datetime:
    return at.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)


def in_words(seconds: float) -> str:
    """'in 40 seconds', 'in 12 minutes', 'in 3 hours': when to try again, rounded up."""
    seconds = max(1, int(seconds + 0.999))
    if seconds < 120:
        return f"in {seconds} seconds"
    if seconds < 2 * 3600:
        return f"in {-(-seconds // 60)} minutes"
    return f"in {-(-seconds // 3600)} hours"


class ImportGate:
    """Admits imports within the quota and records each in `imports` (module docstring)."""

    def __init__(
        self, engine: AsyncEngine, quota: ImportQuota, clock: Callable[[], datetime] = utc_now
    ) -> None:
        self.engine = engine
        self.quota = quota
        self.clock = clock
        self._running: set[str] = set()  # people importing in this process now (at most quota.running)

    @contextlib.asynccontextmanager
    async def admitted(self, owner: str) -> AsyncIterator[Ticket]:
        """The ticket of an import `owner` may run now (ImportLimited if not), held until it ends."""
        if owner in self._running:
            raise ImportLimited(
                "Your previous import is still running: wait for it to finish, then try again.",
                RUNNING_RETRY_SECONDS,
            )
        if len(self._running) >= self.quota.running:
            raise ImportLimited("Other imports are running on this server: try again in a minute.", 60)
        self._running.add(owner)
        try:
            yield await self._start(owner)
        finally:
            self._running.discard(owner)

    async def _start(self, owner: str) -> Ticket:
        now = self.clock()
        since = min(_day_start(now), now - timedelta(hours=1))
        async with self.engine.begin() as connection:
            await connection.execute(
                text("DELETE FROM imports WHERE owner = :who AND started_at < :old"),
                {"who": owner, "old": _stamp(now - KEPT_FOR)},
            )
            rows = await connection.execute(
                text("SELECT started_at FROM imports WHERE owner = :who AND started_at >= :since"),
                {"who": owner, "since": _stamp(since)},
            )
            started = sorted(datetime.fromisoformat(row[0]) for row in rows)
            self._check_counts(now, started)
            ticket = Ticket(str(uuid.uuid4()), owner, now)
            await connection.execute(
                text(
                    "INSERT INTO imports (id, owner, started_at, state, messages, stored_bytes) "
                    "VALUES (:id, :who, :at, 'reading', 0, 0)"
                ),
                {"id": ticket.id, "who": owner, "at": _stamp(now)},
            )
        return ticket

    def _check_counts(self, now: datetime, started: list[datetime]) -> None:
        """ImportLimited when the person started as many imports as the hour or the day allows."""
        last_hour = [at for at in started if at > now - timedelta(hours=1)]
        if len(last_hour) >= self.quota.per_hour:
            wait = (last_hour[-self.quota.per_hour] + timedelta(hours=1) - now).total_seconds()
            raise ImportLimited(
                f"You can start {self.quota.per_hour} imports an hour: try again {in_words(wait)}.", wait
            )
        today = [at for at in started if at >= _day_start(now)]
        if len(today) >= self.quota.per_day:
            wait = (_day_start(now) + timedelta(days=1) - now).total_seconds()
            raise ImportLimited(
                f"You can start {self.quota.per_day} imports a day: try again {in_words(wait)} "
                "(days start at midnight UTC).",
                wait,
            )

    async def reserve(self, ticket: Ticket, read: ImportRead) -> None:
        """Count what the file stores against the person's day (ImportLimited when it does not fit),
        before it is stored: a failure gives it back (`finish`)."""
        day = _day_start(ticket.started_at)
        async with self.engine.begin() as connection:
            used = await connection.execute(
                text(
                    "SELECT COALESCE(SUM(messages), 0), COALESCE(SUM(stored_bytes), 0) FROM imports "
                    "WHERE owner = :who AND started_at >= :day AND id <> :id"
                ),
                {"who": ticket.owner, "day": _stamp(day), "id": ticket.id},
            )
            messages, stored_bytes = (int(value) for value in used.one())
            wait = (day + timedelta(days=1) - self.clock()).total_seconds()
            _check_day(read.stored_messages, messages, self.quota.messages_per_day, "messages", wait)
            _check_day(read.stored_bytes, stored_bytes, self.quota.bytes_per_day, "bytes of text", wait)
            await connection.execute(
                text("UPDATE imports SET state = 'storing', messages = :m, stored_bytes = :b WHERE id = :id"),
                {"m": read.stored_messages, "b": read.stored_bytes, "id": ticket.id},
            )

    async def finish(self, ticket: Ticket, state: str) -> None:
        """The import ended: 'stored', 'partly stored' (what stayed of a failure keeps counting),
        'refused' or 'failed' (nothing stored: its day's counts are given back)."""
        clear = ", messages = 0, stored_bytes = 0" if state in ("refused", "failed") else ""
        async with self.engine.begin() as connection:
            await connection.execute(
                text(f"UPDATE imports SET state = :state{clear} WHERE id = :id"),
                {"state": state, "id": ticket.id},
            )


def _check_day(adding: int, used: int, cap: int, unit: str, wait_seconds: float) -> None:
    if used + adding <= cap:
        return
    left = max(0, cap - used)
    raise ImportLimited(
        f"The file holds {adding:,} {unit}, and your imports may store {left:,} more today "
        f"({cap:,} a day): import a smaller file, or try again {in_words(wait_seconds)} "
        "(days start at midnight UTC).",
        wait_seconds,
    )
