"""The keeper of usage and budgets for one process (admission's `Accounting`).

Counting is in memory (`UsageBatch`); a task adds the batch to the database every
USAGE_FLUSH_SECONDS and at stop, so no turn waits for a write. Budget checks read per-person running
totals (today, this month) and budgets from a bounded TTL cache: loaded from the database on a
person's first turn, added to as their usage is counted here, and re-read every
USAGE_REFRESH_SECONDS, so usage on other replicas and budgets an administrator changed count within
USAGE_FLUSH_SECONDS (theirs) + USAGE_REFRESH_SECONDS. One lock keeps loads and writes apart: a load
then sees every count exactly once (in the database, or still in the batch).

Each request also holds what admission granted it (services/admission/grants.py) in `reserved`
until it ends, when its tokens are counted instead: the rooms a request is granted from count the
person's other running requests in full. Only this process's requests are held; other replicas'
count once written and re-read, as above.

Only signed-in people (`user:<name>`) are kept and budgeted; people known by address are not (no
account to show it to, and addresses are not stored). While the database is unavailable a person
not yet loaded is let through (the failure is logged) rather than refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from cachetools import TTLCache

from services.admission.grants import Room
from services.admission.refusals import Refused
from services.config import Settings
from services.usage.batch import UsageBatch
from services.usage.periods import days_of_month_until, utc_day, utc_now
from services.usage.quotas import Budget, budget_rooms, left_text, over_budget, person_budget
from services.usage.store import UsageStore

logger = logging.getLogger(__name__)

PERSON_PREFIX = "user:"  # admission's key of a signed-in person (services/admission/limits.py: user_key)
IDLE_SECONDS = 3600.0  # a person's running totals are dropped this long after their last check
# Rows (person and day) counted in memory at most between writes; while the database is down beyond
# this, new people's usage is dropped and counted in /metrics (usage_dropped).
USAGE_PENDING_ROWS = 10_000
# People whose running totals a process keeps for quota checks (the least recently used beyond it, and
# anyone idle for IDLE_SECONDS, are read again on their next turn).
USAGE_CACHE_ENTRIES = 10_000
RETENTION_CHECK_SECONDS = 3600.0  # how often retention looks for an expired day (sooner while deleting)


def person_of(user_key: str) -> str | None:
    """The account name in admission's key; None for people known only by address."""
    return user_key[len(PERSON_PREFIX) :] if user_key.startswith(PERSON_PREFIX) else None


@dataclass
class Running:
    """A person's tokens today and this month, as this process knows them, and their budget."""

    day: str
    day_tokens: int
    month_tokens: int
    budget: Budget
    used_at: float


class UsageLedger:
    """Counts usage, writes it in batches, checks budgets; `start`/`stop` own the writing task."""

    def __init__(
        self,
        settings: Settings,
        store: UsageStore,
        available: Callable[[], bool] = lambda: True,
        clock: Callable[[], datetime] = utc_now,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """`available`: whether the database may be used now (the history's breaker)."""
        self.settings = settings
        self.store = store
        self.available = available
        self.clock = clock
        self.monotonic = monotonic
        self.batch = UsageBatch(USAGE_PENDING_ROWS)
        self.running: TTLCache[str, Running] = TTLCache(USAGE_CACHE_ENTRIES, IDLE_SECONDS, timer=monotonic)
        self.reserved: dict[str, int] = {}  # by person: tokens held by running requests (none: no entry)
        self.rows_written_total = 0
        self.write_failures_total = 0
        self.retention_deleted_total = 0
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._refreshed_at = monotonic()
        self._retention_at: float | None = None

    # --- admission's Accounting ------------------------------------------------
    async def check(self, user_key: str) -> None:
        person = person_of(user_key)
        running = await self._running(person) if person is not None else None
        if running is not None:
            refusal = over_budget(running.budget, running.day_tokens, running.month_tokens, self.clock())
            if refusal is not None:
                raise refusal

    def rooms(self, user_key: str) -> list[Room]:
        person = person_of(user_key)
        running = self.running.get(person) if person is not None else None
        now = self.clock()
        if person is None or running is None or running.day != utc_day(now):
            return []
        reserved = self.reserved.get(person, 0)
        return budget_rooms(running.budget, running.day_tokens, running.month_tokens, reserved, now)

    def reserve(self, user_key: str, tokens: int) -> None:
        person = person_of(user_key)
        if person is not None and tokens > 0:
            self.reserved[person] = self.reserved.get(person, 0) + tokens

    def release(self, user_key: str, tokens: int) -> None:
        person = person_of(user_key)
        if person is None or tokens <= 0:
            return
        held = self.reserved.pop(person, 0) - tokens
        if held > 0:
            self.reserved[person] = held

    def started(self, user_key: str, api: bool, documents: int) -> None:
        self._count(user_key, turns=0 if api else 1, api_calls=1 if api else 0, documents=documents)

    def used(self, user_key: str, prompt_tokens: int, answer_tokens: int) -> None:
        self._count(user_key, prompt_tokens=prompt_tokens, answer_tokens=answer_tokens)

    def refused(self, user_key: str, refusal: Refused) -> None:
        self._count(user_key, refusals=1)

    def _count(self, user_key: str, **counts: int) -> None:
        person = person_of(user_key)
        if person is None:
            return
        day = utc_day(self.clock())
        self.batch.add(person, day, **counts)
        if 2 * len(self.batch) >= self.batch.max_rows:
            self._wake.set()  # half full: write now rather than at the next tick
        tokens = max(0, counts.get("prompt_tokens", 0)) + max(0, counts.get("answer_tokens", 0))
        running = self.running.get(person)
        if tokens and running is not None and running.day == day:
            running.day_tokens += tokens
            running.month_tokens += tokens

    # --- running totals ------------------------------------------------------
    async def left(self, user_key: str) -> str | None:
        """What the person has left today and this month (None: not kept, or the database is down)."""
        person = person_of(user_key)
        running = await self._running(person) if person is not None else None
        if running is None:
            return None
        return left_text(running.budget, running.day_tokens, running.month_tokens, self.clock())

    async def _running(self, person: str) -> Running | None:
        today = utc_day(self.clock())
        running = self.running.get(person)
        if running is not None and running.day == today:
            running.used_at = self.monotonic()
            return running
        if not self.available():
            return None
        try:
            async with self._lock:
                return (await self._load([person], today)).get(person)
        except Exception as error:
            logger.warning("usage: running totals of a person could not be read: %s", error)
            return None

    async def _load(self, people: list[str], today: str) -> dict[str, Running]:
        """Stored totals plus what still waits in the batch (call it holding the lock)."""
        totals = await self.store.totals(people, today)
        budgets = await self.store.budgets(people)
        month = days_of_month_until(today)
        now = self.monotonic()
        loaded = {}
        for person in people:
            stored_day, stored_month = totals.get(person, (0, 0))
            role, own = budgets.get(person, (None, {}))
            previous = self.running.get(person)
            running = Running(
                today,
                stored_day + self.batch.tokens(person, [today]),
                stored_month + self.batch.tokens(person, month),
                person_budget(self.settings, role, own),
                previous.used_at if previous is not None else now,
            )
            self.running[person] = loaded[person] = running
        return loaded

    # --- writing and refreshing ----------------------------------------------
    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="usage-writer")

    async def stop(self) -> None:
        """Stop the task, then write what is still counted."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if not await self.flush() and len(self.batch):
            logger.warning("usage: %d row(s) of usage not written at stop", len(self.batch))

    async def _loop(self) -> None:
        flush_every = self.settings.usage_flush_seconds
        refresh_every = self.settings.usage_refresh_seconds
        flushed_at = self.monotonic()
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), min(flush_every, refresh_every))
            woken = self._wake.is_set()
            now = self.monotonic()
            self._wake.clear()
            if woken or now - flushed_at >= flush_every:
                flushed_at = now
                await self.flush()
            if now - self._refreshed_at >= refresh_every:
                await self.refresh()

    async def flush(self) -> bool:
        """Add the batch to the database; on failure it is kept (within its bound) for the next try."""
        if not len(self.batch):
            return True
        if not self.available():
            return False
        async with self._lock:
            rows = self.batch.take()
            try:
                await self.store.add(rows)
            except Exception as error:
                self.batch.put_back(rows)
                self.write_failures_total += 1
                logger.warning("usage: %d row(s) not written yet: %s", len(rows), error)
                return False
        self.rows_written_total += len(rows)
        return True

    async def refresh(self) -> None:
        """Re-read the totals and budgets of everyone checked within IDLE_SECONDS."""
        self._refreshed_at = now = self.monotonic()
        people = [
            person for person, running in list(self.running.items()) if now - running.used_at < IDLE_SECONDS
        ]
        if not people or not self.available():
            return
        try:
            async with self._lock:
                await self._load(people, utc_day(self.clock()))
        except Exception as error:
            logger.warning("usage: running totals not refreshed: %s", error)

    async def retention_round(self) -> int:
        """A maintenance step: delete the oldest stored day past USAGE_RETENTION_DAYS (one day per
        round, hourly, every round while there is more); how many rows went."""
        days = self.settings.usage_retention_days
        now = self.monotonic()
        if not days or not self.available():
            return 0
        if self._retention_at is not None and now - self._retention_at < RETENTION_CHECK_SECONDS:
            return 0
        cutoff = utc_day(self.clock() - timedelta(days=days))
        try:
            deleted = await self.store.delete_oldest_day_before(cutoff)
        except Exception as error:
            logger.warning("usage: retention failed: %s", error)
            return 0
        self._retention_at = None if deleted else now  # more may be waiting: look again next round
        self.retention_deleted_total += deleted
        if deleted:
            logger.info("usage retention: deleted %d row(s) older than %d days", deleted, days)
        return deleted
