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
place and estimate and in ADMISSION_QUEUE_MAX. The row also carries the replica's stream pace
(its running requests, slowest stream and cap: pace.py), so the replicas pace the engine together
and the lowest cap holds for all, and its document parts running and reading their prompt, so the
documents' bounds hold at the engine, not per replica (other_replicas.py). A row holds times and
counts only, never who waits; each row
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
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from services.admission.other_replicas import OtherReplicas
from services.admission.pace import lowest
from services.admission.shared_database import SharedDatabase
from services.admission.tickets import CHAT, DOCUMENT
from services.admission.waiting_line import WaitingLine
from services.config import Settings

logger = logging.getLogger(__name__)

EXPIRY_ROUNDS = 3  # a row not renewed for this many intervals is a replica gone
WRITE = text(
    "INSERT INTO line_places (holder, places, running, slowest, pace_cap, documents, documents_prefilling, "
    "expires_at) VALUES (:holder, :places, :running, :slowest, :cap, :documents, :documents_prefilling, "
    ":expires) ON CONFLICT (holder) DO UPDATE SET places = excluded.places, running = excluded.running, "
    "slowest = excluded.slowest, pace_cap = excluded.pace_cap, documents = excluded.documents, "
    "documents_prefilling = excluded.documents_prefilling, expires_at = excluded.expires_at"
)
READ = text(
    "SELECT places, running, slowest, pace_cap, documents, documents_prefilling FROM line_places "
    "WHERE holder <> :holder AND expires_at > :now"
)
SWEEP = text("DELETE FROM line_places WHERE expires_at <= :now")
LEAVE = text("DELETE FROM line_places WHERE holder = :holder")


def finite_number(value: Any) -> float | None:
    """`value` as a float when it is a finite number (not a boolean); None otherwise."""
    number = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if number else None


def parsed_places(stored: str, most: int) -> list[float]:
    """A row's places (at most `most`); none when it is not a JSON list of finite numbers."""
    try:
        places = json.loads(stored)
    except (TypeError, ValueError):
        return []
    if not isinstance(places, list):
        return []
    numbers = (finite_number(place) for place in places[:most])
    return [number for number in numbers if number is not None]


@dataclass(frozen=True)
class Shared:
    """What one other replica shares: when its waiting chat turns arrived, its stream pace, and its
    document parts running and reading their prompt."""

    places: list[float]
    running: int
    slowest: float | None
    cap: int | None
    documents: int = 0
    documents_prefilling: int = 0


def parsed_row(row: Sequence[Any], most_places: int, most_running: int) -> Shared:
    """A row (places, running, slowest, pace_cap, documents, documents_prefilling), each value checked
    and bounded: a count that is not an integer counts 0 (a cap: none), a rate that is not a finite
    number >= 0 counts none."""
    places, running, slowest, cap, documents, prefilling = (*row, *[None] * 6)[:6]

    def count(value: Any) -> int | None:
        whole = isinstance(value, int) and not isinstance(value, bool)
        return min(max(value, 0), most_running) if whole else None

    rate = finite_number(slowest)
    return Shared(
        parsed_places(places, most_places),
        count(running) or 0,
        rate if rate is not None and rate >= 0 else None,
        count(cap) or None,  # a cap of 0 is none: the lowest is one
        count(documents) or 0,
        count(prefilling) or 0,
    )


class SharedLine:
    """Shares this replica's waiting places and hands the other replicas' to its line."""

    def __init__(
        self,
        settings: Settings,
        line: WaitingLine,
        database: SharedDatabase,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.line = line
        self.database = database
        self.wall = wall
        self.holder = uuid.uuid4().hex  # this replica, in its row
        self.exchanges_total = 0
        self._wrote_busy = False  # whether the row holds places or a pace (an idle line writes once)
        self._task: asyncio.Task | None = None

    def _offset(self) -> float:
        """What turns the line's keys (seconds since its epoch, monotonic) into wall-clock seconds."""
        return self.wall() - self.line.clock() + self.line.epoch

    def own_places(self) -> list[float]:
        """When this replica's waiting chat turns arrived (with their aging), in wall-clock seconds."""
        offset = self._offset()
        most = self.settings.admission_queue_max
        keys = [ticket.key for ticket in self.line.waiting if ticket.kind == CHAT][:most]
        return [round(key + offset, 3) for key in keys]

    def own_row(self) -> dict[str, Any]:
        """What this replica shares: its places and its stream pace."""
        slowest = self.line.pace.own_slowest()
        return {
            "places": json.dumps(self.own_places()),
            "running": self.line.own_running,
            "slowest": None if slowest is None else round(slowest, 3),
            "cap": self.line.pace.cap,
            "documents": self.line.running[DOCUMENT],
            "documents_prefilling": sum(ticket.kind == DOCUMENT for ticket in self.line.prefilling),
        }

    async def exchange(self) -> None:
        """Write this replica's places and pace, read the others', and let the line admit by them."""
        now = self.wall()
        row = self.own_row()
        busy = row["places"] != "[]" or row["running"] > 0 or row["cap"] is not None
        found: list[Sequence[Any]] = []

        async def work(connection: AsyncConnection) -> None:
            if busy or self._wrote_busy:  # an idle replica writes its row once
                expires = now + EXPIRY_ROUNDS * self.settings.shared_line_seconds
                await connection.execute(WRITE, {"holder": self.holder, "expires": expires, **row})
            found.extend(await connection.execute(READ, {"holder": self.holder, "now": now}))
            await connection.execute(SWEEP, {"now": now})

        shared = await self.database.run(work)
        if shared:
            self._wrote_busy = busy
            self.exchanges_total += 1
        self.take(found if shared else [])

    def take(self, rows: Iterable[Sequence[Any]]) -> None:
        """The other replicas' rows as the line's `others` (places in its keys) and its pace's, then
        admit."""
        offset = self._offset()
        line = self.line
        most = self.settings.admission_queue_max
        shared = [parsed_row(row, most, line.capacity.max_running) for row in rows]
        line.pace.share(lowest(*(each.slowest for each in shared)), lowest(*(each.cap for each in shared)))
        line.others = OtherReplicas(
            sorted(place - offset for each in shared for place in each.places),
            sum(each.running for each in shared),
            sum(each.documents for each in shared),
            sum(each.documents_prefilling for each in shared),
        )
        if shared:  # the free slots, split between the replicas until the next exchange
            free = max(0, line.limit - line.engine_running)
            share = math.ceil(free / (1 + len(shared)))
            line.others = replace(line.others, share=share, own_running=line.own_running)
        line.admit_waiting()

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
        self.take([])
        await self.database.run(lambda connection: connection.execute(LEAVE, {"holder": self.holder}))

    def status(self) -> dict[str, Any]:
        """What /status shows of the shared line."""
        line = self.line
        return {
            "others_waiting": len(line.others.waiting),
            "others_running": line.others.running,
            "others_documents": line.others.documents,
            "others_slowest_tokens_per_second": line.pace.others_slowest,
            "others_cap": line.pace.others_cap,
            "exchanges_total": self.exchanges_total,
        }
