"""The shared waiting line's pure parts: rows read from the database (hostile ones too) and the
clock translation between replicas. Its statements on a real PostgreSQL are in
tests/system/admission/test_shared_limits_postgres.py."""

from __future__ import annotations

import asyncio
import json

import pytest

from services.admission.capacity import DecodeCapacity
from services.admission.pace import ADJUST_SECONDS
from services.admission.shared_line import SharedLine, parsed_places, parsed_row
from services.admission.waiting_line import CHAT, MAX_PREFILLING_REQUESTS, WaitingLine
from services.config import Settings
from tests.fakes import FakeClock


class OneSlot(DecodeCapacity):
    limit = 1


class SixSlots(DecodeCapacity):
    limit = 6


def replica(
    monotonic: float, wall: float, slots: type[DecodeCapacity] = OneSlot,
    max_prefilling: int = MAX_PREFILLING_REQUESTS, **changes: object,
) -> SharedLine:  # fmt: skip
    """A replica's line with `slots`, and its sharing (no database)."""
    settings = Settings.from_env({}).replace(admission_max_wait_seconds=1000, **changes)
    line = WaitingLine(settings, slots(5.0, 64), FakeClock(monotonic), max_prefilling)
    return SharedLine(settings, line, database=None, wall=FakeClock(wall))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "stored",
    ["not json", '{"places": [1]}', "null", '"1.5"', "[true, false]", '["1", null, [2]]', "[NaN, Infinity]"],
)
def test_a_row_that_is_not_a_list_of_times_counts_as_no_places(stored: str) -> None:
    assert parsed_places(stored, 100) == []


@pytest.mark.parametrize(
    ("row", "running", "slowest", "cap"),
    [
        (("[]", "5", "2.5", "3"), 0, None, None),  # text where numbers belong
        (("[]", -3, -1.0, 0), 0, None, None),  # below any real value
        (("[]", 10**12, float("nan"), -2), 64, None, None),  # beyond the engine's requests; NaN
        (("[]", True, float("inf"), True), 0, None, None),  # booleans are not counts
        (("[]",), 0, None, None),  # a row of the earlier schema: places only
        (("[]", 3, 4, 2), 3, 4.0, 2),
    ],
)
def test_a_rows_pace_is_checked_and_bounded(
    row: tuple, running: int, slowest: float | None, cap: int | None
) -> None:
    shared = parsed_row(row, 32, most_running=64)
    assert (shared.running, shared.slowest, shared.cap) == (running, slowest, cap)


def test_a_rows_documents_are_counts_and_the_rows_add_up() -> None:
    b = replica(monotonic=50.0, wall=1_000.0, slots=SixSlots)
    assert parsed_row(("[]", 2, None, None, "1", -1), 32, most_running=64).documents == 0
    b.take([("[1000.5]", 3, None, None, 2, 1), ("[]", 1, None, None, 10**9, True)])
    assert b.line.others.running == 4 and b.line.others.documents == 2 + 64, "bounded: at most max_running"
    assert b.line.others.documents_prefilling == 1 and len(b.line.others.waiting) == 1
    assert b.status()["others_documents"] == 66


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
    b.take([(json.dumps(a.own_places()), 1, None, None)])
    mine = b.line.waiting[0].key
    assert b.line.others.waiting == [pytest.approx(mine - 1.0)]
    assert b.line.place_of(None)[0] == 1, "B's person is told of A's turn ahead"
    a.take([(json.dumps(b.own_places()), 1, None, None)])
    assert a.line.place_of(None)[0] == 0, "A's turn came first"
    for wait in waits:
        wait.cancel()
    await asyncio.gather(*waits, return_exceptions=True)
    assert not a.line.waiting and not b.line.waiting


async def _wait(line: WaitingLine) -> None:
    """A chat request that waits for its slot, then holds it until cancelled."""
    async with line.place(CHAT):
        await asyncio.Event().wait()


def test_replicas_pace_the_engine_together() -> None:
    """B runs nothing yet: A's slow stream and cap hold for it too, and A's fast streams let B raise
    the cap it then shares, so a replica with nothing to measure is never kept from running."""
    b = replica(monotonic=50.0, wall=1_000.0, slots=SixSlots)
    line, pace = b.line, b.line.pace
    line.foreign = 4  # at the engine: A's three requests and one of a client that shares no pace
    b.take([("[]", 3, 2.0, 3)])
    assert line.others.running == 3 and pace.engine_cap == 3 and pace.slowest() == 2.0
    assert line.limit == 3 + 1, "A's cap bounds the app's requests; the other client's come on top"
    line.clock.now += 10  # type: ignore[attr-defined]
    pace.adjust(running=line.own_running + line.others.running, model_limit=line.capacity.limit)
    assert pace.cap == 1 and pace.lowered_total == 1, "3 streams at 2 tokens/s for a pace of 5.5: one"
    b.take([("[]", 1, 9.0, 1)])  # A lowered too; its one stream now gets 9 tokens/s
    line.clock.now += 10  # type: ignore[attr-defined]
    pace.adjust(running=line.own_running + line.others.running, model_limit=line.capacity.limit)
    assert pace.cap == 2, "A's fast stream raises B's cap though B runs nothing"
    b.take([])
    assert pace.others_cap is None and pace.others_slowest is None and line.others.running == 0
    assert b.status()["others_running"] == 0


def test_a_cap_another_replica_just_cut_restarts_this_ones_clock() -> None:
    """A cuts the engine's cap on slow streams: B does not cut it again on the same slow windows
    before ADJUST_SECONDS from A's cut; a cap A raised restarts nothing (the lowest still holds)."""
    b = replica(monotonic=50.0, wall=1_000.0, slots=SixSlots)
    line, pace = b.line, b.line.pace
    clock = line.clock

    def adjust() -> None:
        pace.adjust(running=line.own_running + line.others.running, model_limit=line.capacity.limit)

    b.take([("[]", 6, 2.0, 4)])  # A runs six streams at 2 tokens/s and just cut its cap to four
    assert pace.engine_cap == 4 and pace.cap is None
    clock.now += 1  # type: ignore[attr-defined]
    adjust()
    assert pace.cap is None and pace.lowered_total == 0, "the windows A cut on do not cut again here"
    clock.now += ADJUST_SECONDS - 1  # type: ignore[attr-defined]
    b.take([("[]", 6, 2.0, 5)])  # A raised its own: nothing restarts
    adjust()
    assert pace.cap == 2 and pace.engine_cap == 2, "ADJUST_SECONDS after A's cut: six at 2 for 5.5"
    clock.now += 3  # type: ignore[attr-defined]
    b.take([("[]", 2, 9.0, 1)])  # A cut to one; its stream is fast at once
    assert pace.engine_cap == 1
    clock.now += ADJUST_SECONDS - 0.5  # type: ignore[attr-defined]
    adjust()
    assert pace.cap == 2, "B's own cut was longer ago than ADJUST_SECONDS, A's was not: no move"
    clock.now += 0.5  # type: ignore[attr-defined]
    adjust()
    assert pace.cap == 3 and pace.lowered_total == 1, "then a fast stream raises B's own"


@pytest.mark.asyncio
async def test_free_slots_are_split_between_replicas_until_the_next_exchange() -> None:
    """A burst reaches two idle replicas at a limit of six: between two exchanges each starts its share
    of the free slots (three), not all six; a slot its own request frees is its own again, and what
    the other replica did not take comes at the next exchange."""
    a = replica(monotonic=50.0, wall=1_000.0, slots=SixSlots, max_prefilling=0)
    a.take([("[]", 0, None, None)])  # one other replica, idle
    burst = [asyncio.create_task(_wait(a.line)) for _ in range(6)]
    await asyncio.sleep(0)
    assert a.line.own_running == 3 and len(a.line.waiting) == 3, "half of six until the next exchange"
    burst[0].cancel()  # one of its own ends: its slot is reused at once
    await asyncio.sleep(0)
    assert a.line.own_running == 3 and len(a.line.waiting) == 2
    a.line.foreign = 2  # the other replica started two meanwhile
    a.take([("[]", 2, None, None)])  # 6 - 3 - 2 = 1 free: a's share rounds up
    await asyncio.sleep(0)
    assert a.line.own_running == 4 and len(a.line.waiting) == 1
    a.take([])  # alone again (sharing stopped): the limit alone bounds it
    await asyncio.sleep(0)
    assert a.line.own_running == 4 and len(a.line.waiting) == 1, "the engine is full: 4 + 2"
    a.line.foreign = 0
    a.line.admit_waiting()
    assert a.line.own_running == 5 and not a.line.waiting
    for task in burst:
        task.cancel()
    await asyncio.gather(*burst, return_exceptions=True)
