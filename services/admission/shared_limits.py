"""Per-person limits counted in PostgreSQL, so replicas that share it give a person each limit once.

SHARED_LIMITS=auto (the default) counts here when DATABASE_URL is PostgreSQL; limits.py's tables,
this process's own, still count and are checked first (a person over a limit in this process is
refused without a query), and they alone decide while the database cannot answer.

The rows (services/history/limits_schema.py), and why:
- concurrent turns: a lease row per running turn, deleted when it ends. Its replica renews its
  leases every SHARED_LEASE_SECONDS / 3 (one UPDATE per replica, not per turn), so the count is
  exact while replicas live, and the turns of a replica that was killed lapse within
  SHARED_LEASE_SECONDS instead of holding the person's places for good;
- answer tokens per minute, documents per hour, messages per minute: a count per person, kind and
  second, added by UPSERT (`n = limit_counts.n + excluded.n`) and summed over the sliding window,
  so the windows and the refusals are limits.py's (the same `*_refusal` rules; a second's counts
  age out together, up to a second early).
A check and its count are one transaction that first takes the person's advisory lock
(`pg_advisory_xact_lock`): turns and messages sent at once to several replicas are counted one by
one, and no replica can let a person past a limit another replica just reached. Answer tokens are
added when an answer ends, in a task of their own (nothing waits for that write).

PostgreSQL rather than Redis: the replicas already share it, a check is one short transaction of a
few statements on indexed rows (about 2 ms per admission on loopback, p99 under 4 ms, measured by
tests/system/admission/test_shared_limits_postgres.py), and it adds no service to run. SQLite
serves one process (replicas need PostgreSQL): its tables stay in memory, where a check costs
microseconds.

While the database cannot answer (the history's breaker is open, or a statement fails or takes
longer than DATABASE_TIMEOUT_SECONDS: shared_database.py) the check is skipped, counted, and this
process's tables apply: chat never waits for a database that is down, and a person then gets each
limit once per replica, as without sharing. A capacity refusal's time to come back (RESENT_EARLY)
stays per process: capacity is the replica's own waiting line. Times are each replica's wall
clock (keep the replicas' clocks in sync, as cookie expiry needs anyway). People are stored as
digests, and every row is bounded: a write deletes the person's rows past their window, each
replica's renewing task also deletes every expired row (`sweep`), and a stopping replica deletes
its leases.
"""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from collections.abc import Callable
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from services.admission.limits import (
    DOCUMENT_WINDOW_SECONDS,
    MESSAGE_WINDOW_SECONDS,
    TOKEN_WINDOW_SECONDS,
    documents_refusal,
    messages_refusal,
    tokens_refusal,
    turns_refusal,
)
from services.admission.refusals import Refused
from services.admission.shared_database import SharedDatabase, digest, lock
from services.config import Settings

LOCK_CLASS = 7_311_043  # the first key of pg_advisory_xact_lock(class, person) for limits
# A running turn holds one of its person's USER_MAX_CONCURRENT_TURNS in the database this long, renewed
# every third of it by its replica: a killed replica's turns free their places after at most this.
SHARED_LEASE_SECONDS = 60.0
TOKENS, DOCUMENTS, MESSAGES = "tokens", "documents", "messages"

STATE = text(
    "SELECT 'turns' AS kind, 0 AS second, count(*) AS n FROM limit_leases "
    "WHERE person = :person AND expires_at > :now "
    "UNION ALL SELECT kind, second, n FROM limit_counts WHERE person = :person AND "
    "((kind = 'tokens' AND second >= :tokens_since) OR (kind = 'documents' AND second > :documents_since)) "
    "ORDER BY second"
)
MESSAGES_SENT = text(
    "SELECT second, n FROM limit_counts WHERE person = :person AND kind = 'messages' AND second > :since "
    "ORDER BY second"
)
OPEN_LEASE = text(
    "WITH gone AS (DELETE FROM limit_leases WHERE person = :person AND expires_at <= :now) "
    "INSERT INTO limit_leases (id, person, holder, expires_at) VALUES (:id, :person, :holder, :expires)"
)
ADD = text(
    "WITH gone AS (DELETE FROM limit_counts WHERE person = :person AND kind = :kind AND second <= :horizon) "
    "INSERT INTO limit_counts (person, kind, second, n) VALUES (:person, :kind, :second, :n) "
    "ON CONFLICT (person, kind, second) DO UPDATE SET n = limit_counts.n + excluded.n"
)
CLOSE_LEASE = text("DELETE FROM limit_leases WHERE id = :id")
RENEW = text("UPDATE limit_leases SET expires_at = :expires WHERE holder = :holder")
RELEASE_ALL = text("DELETE FROM limit_leases WHERE holder = :holder")
SWEEP_LEASES = text("DELETE FROM limit_leases WHERE expires_at <= :now")
SWEEP_COUNTS = text(
    "DELETE FROM limit_counts WHERE second <= :hour_ago OR (kind <> 'documents' AND second <= :minute_ago)"
)
WINDOWS = {TOKENS: TOKEN_WINDOW_SECONDS, DOCUMENTS: DOCUMENT_WINDOW_SECONDS, MESSAGES: MESSAGE_WINDOW_SECONDS}


def spread(rows: list[tuple[int, int]], after: float) -> list[float]:
    """Counts per second as one time per thing counted (oldest first), those after `after` only."""
    return [float(second) for second, n in rows if second > after for _ in range(n)]


def turn_refusal(
    settings: Settings, rows: list[tuple[str, int, int]], documents: int, now: float
) -> Refused | None:
    """The refusal of a turn with `documents` uploads, from STATE's rows (kind, second, count) of the
    person on every replica; None when it may start."""
    turns = sum(n for kind, _, n in rows if kind == "turns")
    refusal = turns_refusal(turns, settings.user_max_concurrent_turns)
    tokens = [(second, n) for kind, second, n in rows if kind == TOKENS]
    refusal = refusal or tokens_refusal(tokens, settings.user_tokens_per_minute, now)
    if documents and refusal is None:
        uploads = spread([(s, n) for kind, s, n in rows if kind == DOCUMENTS], now - DOCUMENT_WINDOW_SECONDS)
        refusal = documents_refusal(uploads, documents, settings.user_documents_per_hour, now)
    return refusal


class SharedLimits:
    """Checks and counts each person's share in the database, for every replica on it."""

    def __init__(self, settings: Settings, database: SharedDatabase, clock: Callable[[], float] = time.time):
        self.settings = settings
        self.database = database
        self.clock = clock
        self.holder = uuid.uuid4().hex  # this replica, in its leases
        self.held: set[str] = set()  # leases of this process's running turns
        self._renewing: asyncio.Task | None = None

    async def open_turn(self, user_key: str, documents: int = 0) -> str | None:
        """Start a turn of `user_key` with `documents` new uploads: raise Refused over their turns, tokens
        or documents on every replica together; the turn's lease (None: not counted here)."""
        person = digest(user_key)
        now = self.clock()
        settings = self.settings
        if not (settings.user_max_concurrent_turns or settings.user_tokens_per_minute or documents):
            return None  # nothing to check or count: no query
        lease = uuid.uuid4().hex if settings.user_max_concurrent_turns else None

        async def work(connection: AsyncConnection) -> None:
            await lock(connection, LOCK_CLASS, person)
            since = {
                "tokens_since": math.floor(now - TOKEN_WINDOW_SECONDS),
                "documents_since": math.floor(now - DOCUMENT_WINDOW_SECONDS),
            }
            rows = (await connection.execute(STATE, {"person": person, "now": now, **since})).all()
            if (refusal := turn_refusal(settings, [tuple(row) for row in rows], documents, now)) is not None:
                raise refusal
            if lease is not None:
                expires = now + SHARED_LEASE_SECONDS
                values = {"id": lease, "person": person, "holder": self.holder, "expires": expires}
                await connection.execute(OPEN_LEASE, {**values, "now": now})
            if documents and settings.user_documents_per_hour:
                await connection.execute(ADD, _added(person, DOCUMENTS, documents, now))

        if not await self.database.run(work) or lease is None:
            return None
        self.held.add(lease)
        return lease

    def close_turn(self, lease: str | None) -> None:
        """The turn ended: its lease is no longer renewed, and is deleted without waiting for it."""
        if lease is not None and lease in self.held:
            self.held.discard(lease)
            self.database.spawn(lambda connection: connection.execute(CLOSE_LEASE, {"id": lease}))

    async def count_message(self, user_key: str) -> bool:
        """Count one message of `user_key` on every replica together; raise Refused (not counted) when
        the last minute already holds the limit. False: not counted here (the database cannot answer)."""
        limit = self.settings.user_messages_per_minute
        if not limit:
            return True
        person = digest(user_key)
        now = self.clock()

        async def work(connection: AsyncConnection) -> None:
            await lock(connection, LOCK_CLASS, person)
            since = now - MESSAGE_WINDOW_SECONDS
            values = {"person": person, "since": math.floor(since)}
            rows = [(second, n) for second, n in await connection.execute(MESSAGES_SENT, values)]
            if (refusal := messages_refusal(spread(rows, since), limit, now)) is not None:
                raise refusal
            await connection.execute(ADD, _added(person, MESSAGES, 1, now))

        return await self.database.run(work)

    def add_tokens(self, user_key: str, count: int) -> None:
        """An answer of `user_key` streamed `count` tokens: added for every replica, without waiting."""
        if count > 0 and self.settings.user_tokens_per_minute:
            values = _added(digest(user_key), TOKENS, count, self.clock())
            self.database.spawn(lambda connection: connection.execute(ADD, values))

    async def sweep(self) -> None:
        """Delete every expired lease and every count past its window (any replica's)."""
        now = self.clock()
        hour_ago = math.floor(now - DOCUMENT_WINDOW_SECONDS)
        minute_ago = math.floor(now - MESSAGE_WINDOW_SECONDS)

        async def work(connection: AsyncConnection) -> None:
            await connection.execute(SWEEP_LEASES, {"now": now})
            await connection.execute(SWEEP_COUNTS, {"hour_ago": hour_ago, "minute_ago": minute_ago})

        await self.database.run(work)

    def start(self) -> None:
        self._renewing = asyncio.create_task(self._renew_forever(), name="shared-limits-renew")

    async def _renew_forever(self) -> None:
        """Every third of SHARED_LEASE_SECONDS: renew this replica's leases, and sweep."""
        while True:
            await asyncio.sleep(SHARED_LEASE_SECONDS / 3)
            if self.held:
                values = {"expires": self.clock() + SHARED_LEASE_SECONDS, "holder": self.holder}
                await self.database.run(lambda connection, values=values: connection.execute(RENEW, values))
            await self.sweep()

    async def stop(self) -> None:
        """Stop renewing, finish the writes in flight, and free this replica's leases at once."""
        if self._renewing is not None:
            self._renewing.cancel()
            await asyncio.gather(self._renewing, return_exceptions=True)
            self._renewing = None
        await self.database.drain()
        self.held.clear()
        await self.database.run(lambda connection: connection.execute(RELEASE_ALL, {"holder": self.holder}))

    def status(self) -> dict[str, Any]:
        """What /status shows of the shared limits."""
        database = self.database
        return {
            "leases_held": len(self.held),
            "fallbacks": database.fallbacks_total,
            "failing": database.failing,
        }


def _added(person: str, kind: str, n: int, now: float) -> dict[str, Any]:
    """The values of ADD: `n` more of `kind` this second, and the person's older rows of it dropped."""
    horizon = math.floor(now - WINDOWS[kind]) - 1
    return {"person": person, "kind": kind, "second": int(now), "n": n, "horizon": horizon}
