"""The shared waiting line's pure parts: rows read from the database (hostile ones too) and the
clock translation between replicas. Its statements on a real PostgreSQL are in
tests/system/admission/test_shared_limits_postgres.py."""

from __future__ import annotations

import asyncio
import json

import pytest

from services.admission.capacity import DecodeCapacity
from services.admission.shared_line import SharedLine, parsed_places
from services.admission.waiting_line import CHAT, WaitingLine
from services.config import Settings


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class OneSlot(DecodeCapacity):
    limit = 1


def replica(monotonic: float, wall: float, **changes: object) -> SharedLine:
    """A replica's line with one slot, and its sharing (no database)."""
    settings = Settings.from_env({}).replace(admission_max_wait_seconds=1000, **changes)
    line = WaitingLine(settings, OneSlot(5.0, 64), Clock(monotonic))
    return SharedLine(settings, line, database=None, wall=Clock(wall))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "stored",
    ["not json", '{"places": [1]}', "null", '"1.5"', "[true, false]", '["1", null, [2]]', "[NaN, Infinity]"],
)
def test_a_row_that_is_not_a_list_of_times_counts_as_no_places(stored: str) -> None:
    assert parsed_places(stored, 100) == []


def test_a_rows_places_are_numbers_and_bounded() -> None:
    assert parsed_places('[1, 2.5, "x", 3]', 100) == [1.0, 2.5, 3.0]
    assert parsed_places(json.dumps(list(range(10_000))), 32) == [float(n) for n in range(32)]


@pytest.mark.asyncio
async def test_places_cross_replicas_in_each_ones_own_clock() -> None:
    """Replica A's waiting turn arrived at wall time 5,000.0; B started later, on another monotonic
    clock: B sees it 1 s before its own turn that arrived at wall 5,001.0."""
    a, b = replica(monotonic=100.0, wall=5_000.0), replica(monotonic=7.0, wall=4_990.0)
    b.wall.now, b.line.clock.now = 5_001.0, 18.0  # type: ignore[attr-defined]
    waits = [asyncio.create_task(_wait(s.line)) for s in (a, b) for _ in range(2)]  # one runs, one waits
    await asyncio.sleep(0)
    assert a.own_places() == [5_000.0] and b.own_places() == [5_001.0]
    b.take([json.dumps(a.own_places())])
    mine = b.line.waiting[0].key
    assert b.line.others_waiting == [pytest.approx(mine - 1.0)]
    assert b.line.place_of(None)[0] == 1, "B's person is told of A's turn ahead"
    a.take([json.dumps(b.own_places())])
    assert a.line.place_of(None)[0] == 0, "A's turn came first"
    for wait in waits:
        wait.cancel()
    await asyncio.gather(*waits, return_exceptions=True)
    assert not a.line.waiting and not b.line.waiting


async def _wait(line: WaitingLine) -> None:
    """A chat request that waits for its slot, then holds it until cancelled."""
    async with line.place(CHAT):
        await asyncio.Event().wait()
