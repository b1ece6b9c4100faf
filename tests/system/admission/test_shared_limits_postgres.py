"""The shared limits' statements on a real PostgreSQL (Debian's, a throwaway cluster), two "replicas"
being two engines of their own: checks sent at once are counted one by one, a killed replica's turns
lapse, rows stay bounded, a database that is down is skipped at once, and the added latency of one
admission is small (printed: `-s` shows it). Then the waiting lines replicas share: first come,
first served across them, a killed replica's places lapse, a stopped one's row is deleted."""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from harness.postgres import PostgresCluster
from harness.waiting import WAIT_SECONDS, until
from services.accounts.limits import SignInLimiter
from services.accounts.shared_attempts import SharedAttempts, SignInAttempts
from services.admission.capacity import DecodeCapacity
from services.admission.refusals import Refused
from services.admission.shared_database import SharedDatabase
from services.admission.shared_limits import SHARED_LEASE_SECONDS, SharedLimits
from services.admission.shared_line import SharedLine
from services.admission.waiting_line import CHAT, DOCUMENT, WaitingLine
from services.config import Settings
from services.history.database import create_engine
from services.history.migrations import migrate
from tests.fakes import FakeClock

in_loop = pytest.mark.asyncio(loop_scope="module")


@pytest.fixture(scope="module")
def database_url(postgres: PostgresCluster) -> str:
    return postgres.create_database("shared_limits")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engines(database_url: str) -> AsyncIterator[list[AsyncEngine]]:
    """Two engines (connection pools), as two replicas have."""
    found = [create_engine(Settings.from_env({"DATABASE_URL": database_url})) for _ in range(2)]
    await migrate(found[0])
    yield found
    for engine in found:
        await engine.dispose()


def limits(engine: AsyncEngine, clock: FakeClock, **changes: object) -> SharedLimits:
    settings = Settings.from_env({}).replace(**changes)
    return SharedLimits(settings, SharedDatabase(engine, settings.database_timeout_seconds), clock)


async def rows(engine: AsyncEngine, table: str) -> int:
    async with engine.connect() as connection:
        return (await connection.execute(text(f"SELECT count(*) FROM {table}"))).scalar_one()


@in_loop
async def test_turns_sent_at_once_to_two_replicas_get_the_limit_once(engines: list[AsyncEngine]) -> None:
    clock = FakeClock(time.time())
    a, b = (limits(engine, clock, user_max_concurrent_turns=3) for engine in engines)
    tries = [(a if i % 2 else b).open_turn("user:ann") for i in range(12)]
    results = await asyncio.gather(*tries, return_exceptions=True)
    leases = [r for r in results if isinstance(r, str)]
    refused = [r for r in results if isinstance(r, Refused)]
    assert len(leases) == 3 and len(refused) == 9, results
    assert {r.reason for r in refused} == {"user_concurrent_turns"}
    assert "You already have 3 answers in progress" in str(refused[0])
    assert await a.open_turn("user:bob"), "another person is not affected"
    holder = a if leases[0] in a.held else b
    holder.close_turn(leases[0])
    await holder.database.drain()
    assert await b.open_turn("user:ann"), "an ended turn gives its place back"


@in_loop
async def test_a_killed_replicas_turns_lapse_and_a_stopped_ones_are_freed(engines: list[AsyncEngine]) -> None:
    clock = FakeClock(time.time())
    killed, alive = (limits(e, clock, user_max_concurrent_turns=1) for e in engines)
    assert await killed.open_turn("user:cid")
    with pytest.raises(Refused):
        await alive.open_turn("user:cid")
    clock.now += SHARED_LEASE_SECONDS + 1  # the killed replica renews nothing: its lease expires
    assert await alive.open_turn("user:cid")
    await alive.stop()  # a replica that stops frees its leases at once
    assert await killed.open_turn("user:cid"), "the stopped replica's turn no longer counts"


@in_loop
async def test_messages_and_tokens_are_counted_once_across_replicas(engines: list[AsyncEngine]) -> None:
    clock = FakeClock(time.time())
    a, b = (
        limits(engine, clock, user_messages_per_minute=5, user_tokens_per_minute=100) for engine in engines
    )
    counted = await asyncio.gather(
        *((a if i % 2 else b).count_message("user:dee") for i in range(20)), return_exceptions=True
    )
    assert counted.count(True) == 5, counted
    refusal = next(r for r in counted if isinstance(r, Refused))
    assert refusal.reason == "user_messages_per_minute" and "the limit is 5 per minute" in str(refusal)
    assert await b.count_message("user:eve") is True, "another person is not affected"
    clock.now += 61
    assert await a.count_message("user:dee") is True, "a minute later"
    a.add_tokens("user:dee", 60)
    b.add_tokens("user:dee", 60)
    await a.database.drain()
    await b.database.drain()
    with pytest.raises(Refused, match="over 100 answer tokens") as over:
        await b.open_turn("user:dee")
    assert 1 <= over.value.retry_after_seconds <= 61
    assert await b.open_turn("user:fay")


@in_loop
async def test_documents_per_hour_are_counted_across_replicas(engines: list[AsyncEngine]) -> None:
    clock = FakeClock(time.time())
    a, b = (limits(engine, clock, user_documents_per_hour=3) for engine in engines)
    await a.open_turn("user:gus", documents=2)
    clock.now += 600
    with pytest.raises(Refused, match="limit is 3 per hour") as refused:
        await b.open_turn("user:gus", documents=2)
    assert refused.value.retry_after_seconds == pytest.approx(3000, abs=2)
    assert await b.open_turn("user:gus", documents=1), "one more fits the hour"


@in_loop
async def test_rows_past_their_window_are_deleted(engines: list[AsyncEngine]) -> None:
    clock = FakeClock(time.time())
    shared = limits(engines[0], clock)
    for person in range(50):
        await shared.count_message(f"user:p{person}")
        await shared.open_turn(f"user:p{person}")
    assert await rows(engines[0], "limit_counts") >= 50 and await rows(engines[0], "limit_leases") >= 50
    clock.now += 7200  # past every window, the earlier tests' rows' too
    await shared.sweep()
    assert await rows(engines[0], "limit_counts") == 0 and await rows(engines[0], "limit_leases") == 0


@in_loop
async def test_sign_in_guesses_sent_at_once_to_two_replicas_are_counted_one_by_one(
    engines: list[AsyncEngine],
) -> None:
    clock = FakeClock(time.time())
    replicas = []
    for engine in engines:
        local = SignInLimiter(3, 20, 25, 900, 300, clock=clock)
        replicas.append(SignInAttempts(local, SharedAttempts(local, SharedDatabase(engine, 5), clock)))
    waits = await asyncio.gather(*(replicas[i % 2].attempt("hal", "10.1.0.1") for i in range(10)))
    assert waits.count(0) == 3 and all(wait == 300 for wait in waits if wait), waits
    assert await replicas[0].attempt("hal", "10.1.0.2") == 0, "not from another address"
    assert await replicas[1].attempt("ida", "10.1.0.1") == 0, "another account from there"
    clock.now += 301
    assert await replicas[1].attempt("hal", "10.1.0.1") == 0, "the wait ends"
    await replicas[1].succeeded("hal", "10.1.0.1")
    for _ in range(2):
        assert await replicas[0].attempt("hal", "10.1.0.1") == 0, "a success starts the pair afresh"


@in_loop
async def test_an_address_is_slowed_not_locked_for_every_replica_and_a_known_browser_goes(
    engines: list[AsyncEngine],
) -> None:
    clock = FakeClock(time.time())
    replicas = []
    for engine in engines:
        local = SignInLimiter(3, 4, 25, 900, 300, clock=clock)
        replicas.append(SignInAttempts(local, SharedAttempts(local, SharedDatabase(engine, 5), clock)))
    office = "10.2.0.1"
    for number in range(4):  # a script trying many accounts, spread over both replicas
        assert await replicas[number % 2].attempt(f"nobody-{number}", office) == 0
    assert await replicas[0].attempt("nobody-4", office) == 2, "slowed on every replica, not locked"
    clock.now += 2
    assert await replicas[1].attempt("nobody-4", office) == 0
    assert await replicas[0].attempt("nobody-5", office) == 4, "more with each try"
    assert await replicas[1].attempt("kim", office, "kims-laptop") == 0, "a browser kim signed in from"
    await replicas[1].succeeded("kim", office, "kims-laptop")


@in_loop
async def test_a_database_that_is_down_is_skipped_and_the_process_counts_alone() -> None:
    settings = Settings.from_env({"DATABASE_URL": "postgresql://postgres@127.0.0.1:9/none"})
    engine = create_engine(settings)
    shared = SharedLimits(settings, SharedDatabase(engine, 2))
    started = time.perf_counter()
    assert await shared.open_turn("user:jan") is None and await shared.count_message("user:jan") is False
    assert (
        time.perf_counter() - started < 4 and shared.database.fallbacks_total == 2 and shared.database.failing
    )
    closed = SharedLimits(settings, SharedDatabase(engine, 2, available=lambda: False))
    assert await closed.open_turn("user:jan") is None, "the breaker open: not even tried"
    await engine.dispose()


@pytest.mark.long  # a latency percentile: bench/overhead holds the verdict
@in_loop
async def test_the_added_latency_of_one_admission(engines: list[AsyncEngine]) -> None:
    """What sharing adds to a turn's start (open_turn) and to a message (count_message), on loopback."""
    shared = limits(engines[0], time.time, user_max_concurrent_turns=1000, user_messages_per_minute=100_000)
    timings: dict[str, list[float]] = {"open_turn": [], "count_message": []}
    for person in range(300):
        for name, call in (("open_turn", shared.open_turn), ("count_message", shared.count_message)):
            started = time.perf_counter()
            await call(f"user:lat{person % 20}")
            timings[name].append((time.perf_counter() - started) * 1000)
    for name, values in timings.items():
        values = values[20:]  # the pool's connections are opened first
        p50, p99 = statistics.median(values), statistics.quantiles(values, n=100)[98]
        print(f"{name}: p50 {p50:.2f} ms, p99 {p99:.2f} ms over {len(values)}")
        assert p50 < 20, f"{name} adds {p50:.1f} ms"


class TwoSlots(DecodeCapacity):
    limit = 2  # the engine's running limit, the same in every replica


def line_replica(engine: AsyncEngine, wall: FakeClock, available: bool = True) -> SharedLine:
    settings = Settings.from_env({}).replace(admission_max_wait_seconds=1000)
    line = WaitingLine(settings, TwoSlots(5.0, 64), max_prefilling=0)
    return SharedLine(settings, line, SharedDatabase(engine, 5, available=lambda: available), wall)


class Held:
    """A request of `kind` and `owner` in `line`: waits for its slot, then holds it until `end`."""

    def __init__(self, line: WaitingLine, owner: object = None, kind: str = CHAT) -> None:
        self.started, self.done = asyncio.Event(), asyncio.Event()
        self.task = asyncio.create_task(self._hold(line, owner, kind))

    async def _hold(self, line: WaitingLine, owner: object, kind: str) -> None:
        async with line.place(kind, owner=owner):
            self.started.set()
            await self.done.wait()

    async def end(self) -> None:
        self.done.set()
        await self.task


async def placed(line: WaitingLine, *requests: Held) -> None:
    """Return once each of `requests` (all `line` holds) runs or waits: their tasks took their places."""

    def taken() -> bool:
        return sum(r.started.is_set() for r in requests) + len(line.waiting) == len(requests)

    await until(taken, "the requests take their places")


@in_loop
async def test_a_turn_waiting_on_one_replica_goes_before_a_later_one_on_another(
    engines: list[AsyncEngine],
) -> None:
    wall = FakeClock(time.time())
    a, b = (line_replica(engine, wall) for engine in engines)
    a1, b1 = Held(a.line), Held(b.line)
    a.line.foreign = b.line.foreign = 1  # each one's running turn, seen by the other at the engine
    a2 = Held(a.line)  # the engine is full: it waits
    await placed(a.line, a1, a2)
    await placed(b.line, b1)
    assert a1.started.is_set() and b1.started.is_set() and not a2.started.is_set()
    await a.exchange()
    await b.exchange()
    assert len(b.line.others.waiting) == 1 and b.status()["others_waiting"] == 1
    await b1.end()  # a slot frees; b sees it first
    later = object()
    b2 = Held(b.line, owner=later)
    await placed(b.line, b2)
    assert not b2.started.is_set(), "the slot is kept for the turn that waited on the other replica"
    assert b.line.place_of(later)[0] == 1, "its person is told of the turn ahead on the other replica"
    a.line.foreign = 0  # a reads the engine: b's turn ended
    await a.exchange()  # the free slot is split between the replicas at an exchange: b's turn waits
    await asyncio.wait_for(a2.started.wait(), WAIT_SECONDS)
    await a.exchange()  # nobody waits on a any more
    await b.exchange()
    await asyncio.wait_for(b2.started.wait(), WAIT_SECONDS)
    for held in (a1, a2, b2):
        await held.end()
    await a.stop()
    await b.stop()
    assert await rows(engines[0], "line_places") == 0, "stopped replicas delete their rows"


@in_loop
async def test_replicas_share_their_stream_pace_and_the_lowest_cap_holds_for_all(
    engines: list[AsyncEngine],
) -> None:
    wall = FakeClock(time.time())
    a, b = (line_replica(engine, wall) for engine in engines)
    a1 = Held(a.line)
    await placed(a.line, a1)
    a.line.pace.cap = 1  # a's streams were too slow at two
    await a.exchange()
    await b.exchange()
    assert b.status()["others_running"] == 1 and b.status()["others_cap"] == 1
    b.line.foreign = 1  # the engine holds a's request
    b1 = Held(b.line)
    await placed(b.line, b1)
    assert not b1.started.is_set(), "a's cap is the engine's: b's turn waits though the model allows two"
    a.line.pace.cap = None  # a's stream keeps the pace again: the cap goes
    await a.exchange()
    await b.exchange()
    await asyncio.wait_for(b1.started.wait(), WAIT_SECONDS)
    await b.exchange()
    await a.exchange()
    assert a.status()["others_running"] == 1 and a.line.others.running == 1
    for held in (a1, b1):
        await held.end()
    await a.stop()
    await b.stop()


@in_loop
async def test_a_document_part_on_one_replica_holds_the_documents_share_and_lets_one_chat_beside_it(
    engines: list[AsyncEngine],
) -> None:
    wall = FakeClock(time.time())
    a, b = (line_replica(engine, wall) for engine in engines)
    part = Held(a.line, kind=DOCUMENT)
    await placed(a.line, part)
    a.line.pace.cap = 1  # the engine's limit is 1, and the part holds it
    await a.exchange()
    await b.exchange()
    assert b.line.others.documents == 1 and b.line.others.documents_prefilling == 1
    b.line.foreign = 1
    b_part = Held(b.line, kind=DOCUMENT)
    chat, second = Held(b.line), Held(b.line)
    await placed(b.line, b_part, chat, second)
    assert not b_part.started.is_set(), "the documents' share is the engine's: a's part holds it"
    assert chat.started.is_set(), "one chat turn runs beside the other replica's part"
    assert not second.started.is_set(), "the rest wait for the limit"
    await b.exchange()
    await a.exchange()
    assert a.line.others.chats == 1 and a.line.others.documents == 0
    for held in (part, chat):
        await held.end()
    for waiting in (b_part, second):
        waiting.task.cancel()
    await asyncio.gather(b_part.task, second.task, return_exceptions=True)
    await a.stop()
    await b.stop()


@in_loop
async def test_a_killed_replicas_places_lapse_and_a_database_down_counts_none(
    engines: list[AsyncEngine],
) -> None:
    wall = FakeClock(time.time())
    killed, alive = (line_replica(engine, wall) for engine in engines)
    held = [Held(killed.line) for _ in range(3)]  # two run, one waits
    await placed(killed.line, *held)
    await killed.exchange()
    await alive.exchange()
    assert alive.line.others.waiting and await rows(engines[0], "line_places") == 1
    wall.now += 3 * alive.settings.shared_line_seconds + 0.1  # the killed replica renews nothing
    await alive.exchange()
    assert alive.line.others.waiting == [] and await rows(engines[0], "line_places") == 0, "swept"
    down = line_replica(engines[1], wall, available=False)
    down.take([(json.dumps([wall.now - 1]), 1, 1.0, 1, 1, 1)])
    await down.exchange()
    assert down.line.others.waiting == [] and down.exchanges_total == 0, "its line is its own again"
    assert down.line.others.running == 0 and down.line.pace.engine_cap is None, "and its pace"
    assert down.line.others.documents == 0, "and its documents' share"
    for each in held:
        each.task.cancel()
    await asyncio.gather(*(each.task for each in held), return_exceptions=True)
