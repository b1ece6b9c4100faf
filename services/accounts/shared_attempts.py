"""Sign-in attempts counted for every replica: limits.py's rules, in this process and in PostgreSQL.

`SignInAttempts` is what sign-in (password and LDAP) asks. With SHARED_LIMITS on (PostgreSQL) an
attempt is counted and judged in `sign_in_attempts`, before any password is hashed, and counted in
this process's tables too; while the database cannot answer (services/admission/shared_database.py),
or without sharing, this process's tables judge (limits.py: counted before anything is awaited).

The shared table has one row per attempt per key (account and address, address, account; stored as
digests), read and written in one transaction that holds the keys' advisory locks (taken in one
order, so two attempts never wait for each other crosswise): guesses sent at once, to one replica
or spread over several, are counted one by one, and an account or address is locked out at the
limit once, not once per replica. A success on one replica clears the pair for all. Each key keeps
at most the rows its rule reads (limits.py: `kept`), each for max(SIGN_IN_WINDOW_SECONDS,
SIGN_IN_LOCKOUT_SECONDS), and an attempt deletes every expired row at most every SWEEP_SECONDS, so
the table holds at most the attempts of that long.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable

from sqlalchemy import bindparam, text
from sqlalchemy.ext.asyncio import AsyncConnection

from services.accounts.limits import SignInLimiter
from services.admission.shared_database import SharedDatabase, digest, lock

LOCK_CLASS = 7_311_044  # the first key of pg_advisory_xact_lock(class, key) for sign-in attempts
SWEEP_SECONDS = 60.0  # an attempt deletes every replica's expired attempts at most this often

RECENT = text(
    "SELECT id, kind, key, at FROM sign_in_attempts WHERE kind IN :kinds AND key IN :keys ORDER BY at"
).bindparams(bindparam("kinds", expanding=True), bindparam("keys", expanding=True))
COUNT = text("INSERT INTO sign_in_attempts (id, kind, key, at) VALUES (:id, :kind, :key, :at)")
FORGET = text("DELETE FROM sign_in_attempts WHERE id IN :ids").bindparams(bindparam("ids", expanding=True))
SWEEP = text("DELETE FROM sign_in_attempts WHERE at <= :horizon")


class SharedAttempts:
    """The attempts of every replica, in the database."""

    def __init__(
        self, local: SignInLimiter, database: SharedDatabase, clock: Callable[[], float] = time.time
    ):
        """`local`: this process's limiter, whose limits and times this one applies."""
        self.local = local
        self.database = database
        self.clock = clock
        self.swept_at = float("-inf")

    def _keys(self, account: str, address: str | None, device: str | None) -> list[tuple[str, str]]:
        return [(kind, digest(f"{kind}\n{key}")) for kind, key in self.local.keys(account, address, device)]

    async def _recent(self, connection: AsyncConnection, keys: list[tuple[str, str]]) -> dict:
        """Each key's attempts within the horizon, oldest first: (kind, key) -> [(id, at)]; takes the
        keys' locks first, and forgets the rows past the horizon or past the key's limit."""
        for stored in sorted({key for _, key in keys}):
            await lock(connection, LOCK_CLASS, stored)
        values = {"kinds": sorted({kind for kind, _ in keys}), "keys": [key for _, key in keys]}
        horizon = self.clock() - self._horizon_seconds
        found: dict[tuple[str, str], list[tuple[str, float]]] = {key: [] for key in keys}
        stale = []
        for row_id, kind, key, at in await connection.execute(RECENT, values):
            if (kind, key) in found:
                (found[(kind, key)] if at > horizon else stale).append((row_id, at))
        for (kind, _), rows in found.items():
            stale += rows[: max(0, len(rows) - self.local.kept[kind])]
            del rows[: max(0, len(rows) - self.local.kept[kind])]
        if stale:
            await connection.execute(FORGET, {"ids": [row_id for row_id, _ in stale]})
        return found

    async def attempt(self, account: str, address: str | None, device: str | None = None) -> int | None:
        """Start an attempt: 0 = go (counted), else the seconds to wait (nothing counted); None: the
        database could not answer (nothing counted there)."""
        keys = self._keys(account, address, device)
        wait = 0

        async def work(connection: AsyncConnection) -> None:
            nonlocal wait
            now = self.clock()
            found = await self._recent(connection, keys)
            waits = [
                self.local.wait_seconds(kind, [at for _, at in rows], now)
                for (kind, _), rows in found.items()
            ]
            if (wait := max(0, math.ceil(max(waits, default=0.0)))) > 0:
                return
            for kind, key in keys:
                await connection.execute(COUNT, {"id": uuid.uuid4().hex, "kind": kind, "key": key, "at": now})
            if now - self.swept_at >= SWEEP_SECONDS:
                self.swept_at = now
                await connection.execute(SWEEP, {"horizon": now - self._horizon_seconds})

        return wait if await self.database.run(work) else None

    async def withdraw(
        self, account: str, address: str | None, device: str | None = None, pair_too: bool = False
    ) -> None:
        """Take back the latest attempt of each key (`pair_too`: and every attempt of the account at
        this address, or from this device: it signed in)."""
        keys = self._keys(account, address, device)

        async def work(connection: AsyncConnection) -> None:
            found = await self._recent(connection, keys)
            ids = [rows[-1][0] for rows in found.values() if rows]
            ids += [row_id for row_id, _ in found[keys[0]]] if pair_too else []
            if ids:
                await connection.execute(FORGET, {"ids": ids})

        await self.database.run(work)

    @property
    def _horizon_seconds(self) -> float:
        """How long an attempt counts: limits.py's window, or its lockout when longer."""
        return max(self.local.window_seconds, self.local.lockout_seconds)


class SignInAttempts:
    """Answers "may this account, from this address, try now?" for sign-in: this process's count,
    then (when shared) every replica's."""

    def __init__(self, local: SignInLimiter, shared: SharedAttempts | None = None) -> None:
        self.local = local
        self.shared = shared

    async def attempt(self, account: str, address: str | None, device: str | None = None) -> int:
        """0 = go (the attempt is counted), else the seconds to wait (nothing counted). The shared
        count decides when it answers (a success on another replica cleared what this process still
        holds); this process's, counted before anything is awaited, when it cannot. `device`: the
        browser's, when its device cookie is good for this account (devices.py)."""
        shared = self.shared
        if shared is not None and (wait := await shared.attempt(account, address, device)) is not None:
            if not wait:
                self.local.count(account, address, device)  # kept for a time the database cannot answer
            return wait
        return self.local.attempt(account, address, device)

    async def succeeded(self, account: str, address: str | None, device: str | None = None) -> None:
        """The attempt was right: it does not count, and this account-and-address (or device) starts
        afresh."""
        self.local.succeeded(account, address, device)
        if self.shared is not None:
            await self.shared.withdraw(account, address, device, pair_too=True)

    async def withdraw(self, account: str, address: str | None, device: str | None = None) -> None:
        """Take one started attempt back (it could not be checked at all)."""
        self.local.withdraw(account, address, device)
        if self.shared is not None:
            await self.shared.withdraw(account, address, device)
