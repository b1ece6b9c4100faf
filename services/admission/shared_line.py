"""The waiting lines of app replicas on one engine tier, seen by each other through PostgreSQL.

A replica's line counts the requests the engine holds for other replicas (`WaitingLine.foreign`,
read from the servers' /metrics), but not the chat turns waiting in their lines: when a slot
frees, the replica that looks first takes it, whoever waited longest. Through two replicas at 50
people, one replica's turns waited 21 s (P95) against 7.8 s promised while the other's took the
slots that freed.

So every SHARED_LINE_SECONDS each replica writes when its waiting chat turns arrived (the line's
keys as seconds since the epoch) in its row of `line_places`, and reads the other replicas' rows
that have not expired (EXPIRY_ROUNDS intervals: a killed replica's places lapse). Its line then
starts a request only when the engine's running requests plus the others' turns waiting ahead of
it leave a slot (first come, first served across replicas), and counts them in a waiting person's
place and estimate and in ADMISSION_QUEUE_MAX. A row holds times only, never who waits; each row
holds at most ADMISSION_QUEUE_MAX places; a stopping replica deletes its row, every replica sweeps
expired ones. While the database cannot answer, the others' lines count as empty (each replica's
line is its own, as without sharing). Times are wall clocks: keep the replicas' clocks in sync.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from services.admission.shared_database import SharedDatabase
from services.admission.tickets import CHAT
from services.admission.waiting_line import WaitingLine
from services.config import Settings

logger = logging.getLogger(__name__)

EXPIRY_ROUNDS = 3  # a row not renewed for this many intervals is a replica gone
WRITE = text(
    "INSERT INTO line_places (holder, places, expires_at) VALUES (:holder, :places, :expires) "
    "ON CONFLICT (holder) DO UPDATE SET places = excluded.places, expires_at = excluded.expires_at"
)
READ = text("SELECT places FROM line_places WHERE holder <> :holder AND expires_at > :now")
SWEEP = text("DELETE FROM line_places WHERE expires_at <= :now")
LEAVE = text("DELETE FROM line_places WHERE holder = :holder")


def parsed_places(stored: str, most: int) -> list[float]:
    """A row's places (at most `most`); none when it is not a JSON list of finite numbers."""
    try:
        places = json.loads(stored)
    except (TypeError, ValueError):
        return []
    if not isinstance(places, list):
        return []
    numbers = [p for p in places[:most] if isinstance(p, int | float) and not isinstance(p, bool)]
    return [float(p) for p in numbers if math.isfinite(p)]


class SharedLine:
    """Shares this replica's waiting places and hands the other replicas' to its line."""

    def __init__(
        self, settings: Settings, line: WaitingLine, database: SharedDatabase,
        wall: Callable[[], float] = time.time,
    ) -> None:  # fmt: skip
        self.settings, self.line, self.database, self.wall = settings, line, database, wall
        self.holder = uuid.uuid4().hex  # this replica, in its row
        self.exchanges_total = 0
        self._wrote_places = False  # whether the row holds places (an empty line writes once)
        self._task: asyncio.Task | None = None

    def _offset(self) -> float:
        """What turns the line's keys (seconds since its epoch, monotonic) into wall-clock seconds."""
        return self.wall() - self.line.clock() + self.line.epoch

    def own_places(self) -> list[float]:
        """When this replica's waiting chat turns arrived (with their aging), in wall-clock seconds."""
        offset, most = self._offset(), self.settings.admission_queue_max
        keys = [ticket.key for ticket in self.line.waiting if ticket.kind == CHAT][:most]
        return [round(key + offset, 3) for key in keys]

    async def exchange(self) -> None:
        """Write this replica's places, read the others', and let the line admit by them."""
        now, places = self.wall(), self.own_places()
        interval = self.settings.shared_line_seconds
        found: list[str] = []

        async def work(connection: AsyncConnection) -> None:
            if places or self._wrote_places:
                values = {"holder": self.holder, "places": json.dumps(places),
                          "expires": now + EXPIRY_ROUNDS * interval}  # fmt: skip
                await connection.execute(WRITE, values)
            found.extend((await connection.execute(READ, {"holder": self.holder, "now": now})).scalars())
            await connection.execute(SWEEP, {"now": now})

        shared = await self.database.run(work)
        if shared:
            self._wrote_places = bool(places)
            self.exchanges_total += 1
        self.take(found if shared else [])

    def take(self, rows: Iterable[str]) -> None:
        """The other replicas' rows as the line's `others_waiting` (in its keys), then admit."""
        offset, most = self._offset(), self.settings.admission_queue_max
        others = [place - offset for row in rows for place in parsed_places(row, most)]
        self.line.others_waiting = sorted(others)
        self.line.admit_waiting()

    def start(self) -> None:
        self._task = asyncio.create_task(self._exchange_forever(), name="shared-line")

    async def _exchange_forever(self) -> None:
        while True:
            await asyncio.sleep(self.settings.shared_line_seconds)
            try:
                await self.exchange()
            except Exception:  # a bad row must not stop the exchange
                logger.exception("shared waiting line: exchange failed")

    async def stop(self) -> None:
        """Stop sharing, forget the others' places, and delete this replica's row."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        self.line.others_waiting = []
        await self.database.run(lambda connection: connection.execute(LEAVE, {"holder": self.holder}))

    def status(self) -> dict[str, Any]:
        """What /status shows of the shared line."""
        return {"others_waiting": len(self.line.others_waiting), "exchanges_total": self.exchanges_total}
