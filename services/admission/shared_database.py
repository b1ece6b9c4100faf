"""The database the replicas' shared limits are counted in: short transactions that never make a
request wait for a database that is down (shared_limits.py, services/accounts/shared_attempts.py).

A transaction is skipped while the history's breaker says the database is unavailable, and given up
after DATABASE_TIMEOUT_SECONDS; either way the caller is told "not counted here" and its own
process's tables decide. Keys (people, accounts, addresses) are stored as digests, and each check
takes a transaction-scoped advisory lock on its key, so checks of one key on several replicas run
one after the other.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from services.admission.refusals import Refused

logger = logging.getLogger(__name__)

LOCK = text("SELECT pg_advisory_xact_lock(:class, :key)")
Work = Callable[[AsyncConnection], Awaitable[Any]]


def digest(key: str) -> str:
    """What a person or a sign-in key is stored as: never their name or address."""
    return hashlib.sha256(key.encode()).hexdigest()[:32]


def lock_key(stored: str) -> int:
    """The second key of the advisory lock of a stored digest (a signed 32-bit number)."""
    return int(stored[:8], 16) - 2**31


async def lock(connection: AsyncConnection, lock_class: int, stored: str) -> None:
    """Hold `stored`'s lock of `lock_class` until the transaction ends."""
    await connection.execute(LOCK, {"class": lock_class, "key": lock_key(stored)})


class SharedDatabase:
    """Runs the shared limits' transactions, or says it could not."""

    def __init__(
        self,
        engine: AsyncEngine,
        timeout_seconds: float,
        available: Callable[[], bool] = lambda: True,
        failed: Callable[[BaseException], None] = lambda error: None,
        name: str = "shared limits",
    ) -> None:
        """`available`: may the database be used now (the history's breaker); `failed`: told of an error."""
        self.engine = engine
        self.timeout_seconds = timeout_seconds
        self.available = available
        self.failed = failed
        self.name = name
        self.fallbacks_total = 0  # checks and counts the database could not take
        self._failed = False  # the last transaction tried failed
        self._tasks: set[asyncio.Task] = set()

    async def run(self, work: Work) -> bool:
        """`work` in one transaction, within the timeout; False (nothing counted) when the database
        cannot answer. A Refused raised by `work` rolls it back and goes to the caller."""
        if not self.available():
            self.fallbacks_total += 1
            return False
        try:
            await asyncio.wait_for(self._transaction(work), self.timeout_seconds)
        except Refused:
            raise
        except Exception as error:
            self.fallbacks_total += 1
            if not self._failed:
                logger.warning("%s: %s; each process counts its own meanwhile", self.name, _line(error))
            self._failed = True
            self.failed(error)
            return False
        if self._failed:
            logger.warning("%s: the database answers again; counted for every replica again", self.name)
        self._failed = False
        return True

    @property
    def failing(self) -> bool:
        """True while each process counts alone: the last transaction failed, or none is tried because
        the database is known to be down (the history's breaker is open, or its schema not yet in
        place), which is most of an outage: the breaker skips every transaction until it closes."""
        return self._failed or not self.available()

    async def _transaction(self, work: Work) -> None:
        async with self.engine.begin() as connection:
            await work(connection)

    def spawn(self, work: Work) -> None:
        """Run `work` without waiting for it (a count nothing waits for)."""
        task = asyncio.ensure_future(self.run(work))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def drain(self) -> None:
        """Wait (within the timeout) for the writes still in flight."""
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=self.timeout_seconds)


def _line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0][:300]
