"""Usage and budgets without a server: UTC periods and resets, the bounded batch, budgets and their
refusals, and the ledger over a real SQLite database (two ledgers on one file stand for two replicas)."""

from __future__ import annotations

import csv
import io
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
import pytest_asyncio
from sqlalchemy.ext.asyncio import AsyncEngine

from services.accounts.store import AccountStore
from services.admission.refusals import Refused
from services.admission.service import Admission
from services.api.usage import AnswerMeter, prompt_parts
from services.config import Settings
from services.engine.load import EngineLoad
from services.history.database import create_engine
from services.history.migrations import migrate
from services.usage import UsageLedger, UsageStore, usage_csv
from services.usage.batch import UsageBatch
from services.usage.periods import (
    days_back,
    days_of_month_until,
    next_day_reset,
    next_month_reset,
    utc_day,
)
from services.usage.quotas import QUOTA_DAY, QUOTA_MONTH, Budget, over_budget, person_budget

in_loop = pytest.mark.asyncio(loop_scope="module")
HOSTILE_NAMES = (
    "o'brien",
    'x"); DROP TABLE usage_days; --',
    '=HYPERLINK("http://evil")',
    "名前",
    "-2+3",
    "a,b\nc",
)


class Clock:
    """A settable UTC time and monotonic time for the ledger."""

    def __init__(self, now: datetime) -> None:
        self.now = now
        self.seconds = 1000.0

    def utc(self) -> datetime:
        return self.now

    def monotonic(self) -> float:
        return self.seconds

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)
        self.seconds += seconds


def settings(**changes: object) -> Settings:
    return Settings.from_env({}).replace(**changes)


@pytest_asyncio.fixture(loop_scope="module")
async def database(tmp_path: Path) -> AsyncIterator[AsyncEngine]:
    engine = create_engine(Settings.from_env({"DATA_DIR": str(tmp_path)}))
    await migrate(engine)
    yield engine
    await engine.dispose()


def ledger_on(engine: AsyncEngine, clock: Clock, **changes: object) -> UsageLedger:
    return UsageLedger(settings(**changes), UsageStore(engine), clock=clock.utc, monotonic=clock.monotonic)


# --- periods --------------------------------------------------------------------------------------
def test_a_day_is_the_utc_day_whatever_the_clock_zone() -> None:
    late_in_new_york = datetime(2026, 12, 31, 22, 30, tzinfo=timezone(timedelta(hours=-5)))
    assert utc_day(late_in_new_york) == "2027-01-01", "03:30 UTC on the first"
    assert utc_day(datetime(2026, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)) == "2026-12-31"
    assert utc_day(datetime(2027, 1, 1, 0, 0, tzinfo=UTC)) == "2027-01-01"


def test_resets_are_the_next_utc_midnight_and_the_first_of_next_month() -> None:
    now = datetime(2026, 12, 31, 23, 59, 59, tzinfo=UTC)
    assert next_day_reset(now) == datetime(2027, 1, 1, tzinfo=UTC)
    assert next_month_reset(now) == datetime(2027, 1, 1, tzinfo=UTC), "December rolls into next year"
    assert next_month_reset(datetime(2027, 1, 1, tzinfo=UTC)) == datetime(2027, 2, 1, tzinfo=UTC)
    assert next_day_reset(datetime(2028, 2, 28, 12, tzinfo=UTC)) == datetime(2028, 2, 29, tzinfo=UTC)
    assert next_month_reset(datetime(2028, 2, 29, 12, tzinfo=UTC)) == datetime(2028, 3, 1, tzinfo=UTC)


def test_day_ranges() -> None:
    assert days_back("2027-03-01", 1) == "2027-03-01"
    assert days_back("2027-03-01", 2) == "2027-02-28"
    assert days_back("2027-03-01", 0) == "2027-03-01", "at least today"
    assert days_of_month_until("2027-03-03") == ["2027-03-01", "2027-03-02", "2027-03-03"]


# --- budgets ----------------------------------------------------------------------------------------
def test_a_used_up_day_is_refused_with_what_is_left_and_when_it_resets() -> None:
    now = datetime(2026, 12, 5, 18, 0, tzinfo=UTC)
    assert over_budget(Budget(100, 1000), 99, 99, now) is None
    refusal = over_budget(Budget(100, 1000), 100, 100, now)
    assert isinstance(refusal, Refused) and refusal.reason == QUOTA_DAY
    assert "100 of your 100 tokens for today (UTC): none left" in str(refusal)
    assert "00:00 UTC, in ~6 h" in str(refusal)
    assert refusal.retry_after_seconds == 6 * 3600


def test_a_used_up_month_is_told_before_the_day_and_zero_is_unlimited() -> None:
    now = datetime(2026, 12, 5, 18, 0, tzinfo=UTC)
    refusal = over_budget(Budget(100, 1000), 500, 1000, now)
    assert refusal is not None and refusal.reason == QUOTA_MONTH
    assert "resets at 2027-01-01 00:00 UTC" in str(refusal)
    assert refusal.retry_after_seconds == (datetime(2027, 1, 1, tzinfo=UTC) - now).total_seconds()
    assert over_budget(Budget(0, 0), 10**12, 10**12, now) is None


def test_a_persons_own_budget_replaces_their_roles_for_that_period_only() -> None:
    s = settings(quota_tokens_per_day_user=10, quota_tokens_per_month_user=100, quota_tokens_per_day_admin=0)
    assert person_budget(s, "user", {}) == Budget(10, 100)
    assert person_budget(s, None, {}) == Budget(10, 100), "no role: a user's budget"
    assert person_budget(s, "user", {"day": 50}) == Budget(50, 100)
    assert person_budget(s, "admin", {}) == Budget(0, 0)
    assert person_budget(s, "admin", {"month": 7}) == Budget(0, 7)


# --- the batch --------------------------------------------------------------------------------------
def test_the_batch_is_bounded_and_counts_what_it_drops() -> None:
    batch = UsageBatch(max_rows=2)
    assert batch.add("a", "2026-12-05", prompt_tokens=5, turns=1)
    assert batch.add("b", "2026-12-05", answer_tokens=3)
    assert batch.add("a", "2026-12-05", prompt_tokens=1), "a row it holds still takes counts"
    assert not batch.add("c", "2026-12-05", prompt_tokens=7, refusals=1)
    assert len(batch) == 2 and batch.dropped == 8
    assert batch.tokens("a", ["2026-12-05", "2026-12-04"]) == 6
    assert not batch.add("a", "2026-12-06", turns=-5), "a new day is a new row"
    with pytest.raises(ValueError, match="unknown"):
        batch.add("a", "2026-12-05", bogus=1)


def test_rows_put_back_after_a_failed_write_merge_with_new_counts_within_the_bound() -> None:
    batch = UsageBatch(max_rows=2)
    batch.add("a", "d1", turns=1)
    taken = batch.take()
    assert len(batch) == 0
    batch.add("a", "d1", turns=2)
    batch.add("b", "d1", turns=1)
    batch.put_back({**taken, ("c", "d1"): [0, 0, 4, 0, 0, 0]})
    assert batch.rows[("a", "d1")][2] == 3 and ("c", "d1") not in batch.rows and batch.dropped == 4


# --- the ledger on SQLite ---------------------------------------------------------------------------
@in_loop
async def test_usage_is_written_in_batches_and_two_replicas_add_up(database: AsyncEngine) -> None:
    clock = Clock(datetime(2026, 12, 5, 12, tzinfo=UTC))
    first, second = ledger_on(database, clock), ledger_on(database, clock)
    for ledger in (first, second):
        ledger.started("user:alice", api=False, documents=1)
        ledger.used("user:alice", 30, 12)
        ledger.started("user:alice", api=True, documents=0)
        ledger.refused("user:alice", Refused("x", "no"))
        ledger.used("address:10.0.0.9", 1000, 1000)  # people known by address are not kept
    assert not await UsageStore(database).days(), "nothing written before a flush"
    assert await first.flush() and await second.flush()
    (row,) = await UsageStore(database).days()
    assert (row.person, row.day, row.prompt_tokens, row.answer_tokens) == ("alice", "2026-12-05", 60, 24)
    assert (row.turns, row.documents, row.api_calls, row.refusals) == (2, 2, 2, 2)


@in_loop
async def test_budgets_hold_across_replicas_within_the_refresh(database: AsyncEngine) -> None:
    clock = Clock(datetime(2026, 12, 5, 12, tzinfo=UTC))
    changes = {"quota_tokens_per_day_user": 100, "usage_refresh_seconds": 10.0}
    first, second = ledger_on(database, clock, **changes), ledger_on(database, clock, **changes)
    await first.check("user:bob")
    await second.check("user:bob")  # both loaded bob's totals (none yet)
    first.used("user:bob", 60, 40)
    with pytest.raises(Refused, match="100 of your 100 tokens"):
        await first.check("user:bob")
    await second.check("user:bob")  # the other replica has not seen it yet
    await first.flush()
    clock.advance(10)
    await second.refresh()
    with pytest.raises(Refused):
        await second.check("user:bob")
    await UsageStore(database).set_budget("bob", "day", 500)  # an administrator raises his budget
    await first.refresh()
    await first.check("user:bob")
    assert "400 left" in (await first.left("user:bob") or "")


@in_loop
async def test_a_load_counts_what_waits_in_the_batch_once(database: AsyncEngine) -> None:
    clock = Clock(datetime(2026, 12, 5, 12, tzinfo=UTC))
    ledger = ledger_on(database, clock, quota_tokens_per_day_user=100)
    ledger.used("user:carol", 50, 0)  # counted before her first check: still in the batch
    await ledger.check("user:carol")
    assert ledger.running["carol"].day_tokens == 50
    await ledger.flush()
    await ledger.refresh()
    assert ledger.running["carol"].day_tokens == 50, "written and re-read: not counted twice"


@in_loop
async def test_the_day_budget_starts_again_at_utc_midnight_and_the_month_goes_on(
    database: AsyncEngine,
) -> None:
    clock = Clock(datetime(2026, 12, 31, 23, 59, 59, tzinfo=UTC))
    ledger = ledger_on(database, clock, quota_tokens_per_day_user=100, quota_tokens_per_month_user=150)
    await ledger.check("user:dave")
    ledger.used("user:dave", 100, 0)
    with pytest.raises(Refused) as refused:
        await ledger.check("user:dave")
    assert refused.value.reason == QUOTA_DAY and refused.value.retry_after_seconds == 1
    clock.advance(1)  # 2027-01-01: a new day and a new month
    await ledger.check("user:dave")
    ledger.used("user:dave", 0, 10)
    await ledger.flush()
    days = {row.day: row.tokens for row in await UsageStore(database).days("dave")}
    assert days == {"2026-12-31": 100, "2027-01-01": 10}
    clock.now = datetime(2027, 1, 2, 9, tzinfo=UTC)
    await ledger.check("user:dave")
    ledger.used("user:dave", 140, 0)
    with pytest.raises(Refused) as refused:
        await ledger.check("user:dave")
    assert refused.value.reason == QUOTA_MONTH, "150 this month; yesterday's 10 count"


@in_loop
async def test_hostile_names_round_trip_and_csv_never_carries_a_formula(database: AsyncEngine) -> None:
    clock = Clock(datetime(2026, 12, 5, 12, tzinfo=UTC))
    ledger = ledger_on(database, clock)
    for name in HOSTILE_NAMES:
        ledger.used(f"user:{name}", 1, 1)
    await ledger.flush()
    store = UsageStore(database)
    rows = await store.days()
    assert sorted(row.person for row in rows) == sorted(HOSTILE_NAMES)
    assert [row.person for row in await store.days("o'brien")] == ["o'brien"], "one person's rows only"
    parsed = list(csv.reader(io.StringIO(usage_csv(rows))))
    assert parsed[0][:3] == ["person", "day", "prompt_tokens"] and len(parsed) == len(HOSTILE_NAMES) + 1
    assert not any(line[0].startswith(("=", "+", "-", "@")) for line in parsed[1:])
    assert {line[0].lstrip("'") for line in parsed[1:]} == set(HOSTILE_NAMES)
    assert len(await store.days(limit=2)) == 2 and await store.days(limit=-1) == []


@in_loop
async def test_retention_deletes_the_oldest_day_past_the_limit_one_day_a_round(database: AsyncEngine) -> None:
    clock = Clock(datetime(2026, 12, 5, 12, tzinfo=UTC))
    ledger = ledger_on(database, clock, usage_retention_days=10)
    for days_ago in (12, 11, 10, 0):
        ledger.batch.add("erin", utc_day(clock.now - timedelta(days=days_ago)), turns=1)
    await ledger.flush()
    assert await ledger.retention_round() == 1 and await ledger.retention_round() == 1
    assert await ledger.retention_round() == 0, "the day exactly 10 days back is kept"
    assert len(await UsageStore(database).days("erin")) == 2


@in_loop
async def test_a_failed_write_keeps_the_counts_for_the_next_one(database: AsyncEngine) -> None:
    clock = Clock(datetime(2026, 12, 5, 12, tzinfo=UTC))
    up = {"now": False}
    ledger = UsageLedger(settings(), UsageStore(database), lambda: up["now"], clock.utc, clock.monotonic)
    ledger.used("user:frank", 3, 4)
    await ledger.check("user:frank")  # the database is "down": let through, nothing loaded
    assert not await ledger.flush() and len(ledger.batch) == 1
    up["now"] = True
    await ledger.stop()  # stop writes what is still counted
    assert [row.tokens for row in await UsageStore(database).days("frank")] == [7]


# --- admission and the API's meter -----------------------------------------------------------------
class Recorded:
    def __init__(self, budget_left: bool = True) -> None:
        self.calls: list[tuple] = []
        self.budget_left = budget_left

    async def check(self, user_key: str) -> None:
        if not self.budget_left:
            raise Refused(QUOTA_DAY, "no tokens left", 60)

    def started(self, user_key: str, api: bool, documents: int) -> None:
        self.calls.append(("started", user_key, api, documents))

    def used(self, user_key: str, prompt_tokens: int, answer_tokens: int) -> None:
        self.calls.append(("used", user_key, prompt_tokens, answer_tokens))

    def refused(self, user_key: str, refusal: Refused) -> None:
        self.calls.append(("refused", user_key, refusal.reason))


@in_loop
async def test_admission_asks_for_the_budget_before_a_turn_and_counts_what_happened() -> None:
    accounting = Recorded()
    admission = Admission(settings(), EngineLoad(), max_running=64, accounting=accounting)
    async with admission.turn("user:alice", documents=2):
        pass
    async with admission.admit("api", "user:alice") as slot:
        slot.used(7, 3)
    assert accounting.calls == [
        ("started", "user:alice", False, 2), ("started", "user:alice", True, 0), ("used", "user:alice", 7, 3),
    ]  # fmt: skip
    accounting.budget_left = False
    with pytest.raises(Refused, match="no tokens left"):
        async with admission.turn("user:alice"):
            pytest.fail("a turn over budget must not start")
    assert accounting.calls[-1] == ("refused", "user:alice", QUOTA_DAY)
    assert admission.line.refusals[QUOTA_DAY] == 1


@in_loop
async def test_api_prompt_tokens_come_from_vllm_or_from_the_request() -> None:
    sent: list = []

    async def send(message: dict) -> None:
        sent.append(message)

    request = {
        "messages": [{"role": "user", "content": "one two"}, {"content": [{"type": "text", "text": "x"}]}]
    }
    meter = AnswerMeter(send, request)
    await meter(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]}
    )
    await meter(
        {"type": "http.response.body", "body": b'{"usage": {"completion_tokens": 4, "prompt_tokens": 9}}'}
    )
    assert meter.prompt_tokens(lambda text: 1000) == 9
    counted = AnswerMeter(send, request)
    await counted({"type": "http.response.start", "status": 200, "headers": []})
    assert counted.prompt_tokens(lambda text: len(text.split())) == 3
    failed = AnswerMeter(send, request)
    await failed({"type": "http.response.start", "status": 400, "headers": []})
    assert failed.prompt_tokens(lambda text: 1000) == 0, "the engine read nothing"


def test_prompt_parts_take_only_what_they_understand() -> None:
    assert prompt_parts({"prompt": [[1, 2, 3], [4], "hi", None, {"a": 1}]}) == (["hi"], 4)
    assert prompt_parts({"prompt": [5, 6]}) == ([], 2)
    assert prompt_parts({"messages": [None, 3, {"content": {"text": 1}}, {"content": [None, 7]}]}) == ([], 0)
    assert prompt_parts(["not", "a", "dict"]) == ([], 0)


@in_loop
async def test_the_command_sets_and_shows_a_budget(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from services.usage.__main__ import parse_arguments, run

    s = Settings.from_env({"DATA_DIR": str(tmp_path / "cli")})
    engine = create_engine(s)
    await migrate(engine)
    await AccountStore(engine).add("gina", "gina-password-1")
    await engine.dispose()
    shown = await run(parse_arguments(["quota", "set", "Gina", "--day", "500"]), s)
    assert "day    500 tokens (own budget" in shown and "2,000,000" in shown
    shown = await run(parse_arguments(["quota", "clear", "gina"]), s)
    assert "day    2,000,000 tokens (user's default" in shown
    with pytest.raises(ValueError, match="no account named"):
        await run(parse_arguments(["quota", "show", "nobody"]), s)
    assert (await run(parse_arguments(["show", "--csv"]), s)).startswith("person,day,prompt_tokens")
