"""The parts that make token limits hold per token: a request's demand read as vLLM reads it, the
answer limit granted from what is left in each window, the refusals that say what is left and when,
and reservations that are always given back. The behaviour through the doors people use:
tests/unit/test_token_budgets.py."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.admission.grants import Demand, Room, answer_limit
from services.admission.limits import UserLimits, user_key
from services.admission.refusals import QUOTA_DAY, QUOTA_MONTH, USER_TOKENS_PER_MINUTE, Refused
from services.admission.service import Admission
from services.admission.waiting_line import API
from services.admission.waiting_line import CHAT as CHAT_TURN
from services.api.demand import request_demand, with_answer_limit
from services.config import Settings
from services.engine.chat_engine import SamplingSettings
from services.engine.load import EngineLoad
from services.history.usage_schema import USAGE_COUNTERS
from services.usage import UsageLedger
from services.usage.quotas import Budget, budget_rooms
from tests.fakes import FakeClock, MemoryUsageStore, WordEngine

NOW = datetime(2026, 12, 10, 12, 0, tzinfo=UTC)
CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
HELLO = [{"role": "user", "content": "Say hello."}]
# no waiting line (READING_PACE_TOKENS_PER_SECOND=0): requests run at once
NO_LINE = Settings.from_env({"USER_MAX_CONCURRENT_TURNS": "0", "READING_PACE_TOKENS_PER_SECOND": "0"})


def words(text: str) -> int:
    return len(text.split())


def room(tokens: int, counts_prompt: bool = True) -> Room:
    def refusal(needed: int) -> Refused:
        return Refused("test", f"needs {needed}, {tokens} left")

    return Room(tokens, counts_prompt, refusal)


def test_a_demand_runs_as_asked_cut_to_the_tightest_room_or_refused() -> None:
    asked = Demand(prompt_tokens=10, answer_tokens=100, sequences=4)
    assert answer_limit(asked, [room(1000)], shortest=16) == 100
    assert answer_limit(asked, [room(1000), room(210)], shortest=16) == 50, "(210 - 10) // 4"
    assert answer_limit(asked, [room(200, counts_prompt=False)], shortest=16) == 50, "answers only"
    with pytest.raises(Refused, match="needs 74, 73 left"):  # 10 + 4 x 16
        answer_limit(asked, [room(1000), room(73)], shortest=16)
    assert answer_limit(Demand(10, 5, 4), [room(30)], shortest=16) == 5, "asks fewer than the shortest: all"
    with pytest.raises(Refused, match="needs 1, 0 left"):
        answer_limit(Demand(0, 0), [room(0)], shortest=16)


@given(
    prompt=st.integers(0, 5000),
    answer=st.integers(0, 5000),
    sequences=st.integers(1, 64),
    shortest=st.integers(1, 64),
    rooms=st.lists(st.tuples(st.integers(-100, 20_000), st.booleans()), max_size=3),
)
def test_what_is_granted_fits_every_room_or_is_refused(
    prompt: int, answer: int, sequences: int, shortest: int, rooms: list[tuple[int, bool]]
) -> None:
    asked = Demand(prompt, answer, sequences)
    try:
        limit = answer_limit(asked, [room(tokens, counts) for tokens, counts in rooms], shortest)
    except Refused:
        return
    assert min(shortest, answer) <= limit <= answer
    for tokens, counts_prompt in rooms:
        assert (prompt if counts_prompt else 0) + sequences * limit <= tokens


@pytest.mark.parametrize(
    ("path", "body", "expected"),
    [
        (CHAT, {"messages": HELLO, "n": "3", "max_tokens": "8.0"}, Demand(2, 8, 3)),
        (CHAT, {"messages": HELLO, "max_tokens": 8, "max_completion_tokens": 1e3}, Demand(2, 1000, 1)),
        (CHAT, {"messages": HELLO, "max_tokens": None}, Demand(2, 98, 1)),  # the context's remainder
        (CHAT, {"messages": HELLO, "max_tokens": "8_0"}, Demand(2, 80, 1)),
        (CHAT, {"messages": HELLO, "max_tokens": 8.5, "n": True}, Demand(2, 98, 1)),  # vLLM refuses 8.5
        (COMPLETIONS, {"prompt": [[1, 2], [3]], "n": 2.0}, Demand(3, 16, 4)),  # vLLM's default 16
        (COMPLETIONS, {"prompt": "a b c", "max_tokens": 0, "echo": True}, Demand(3, 1, 1)),
        (COMPLETIONS, {"prompt": ["a", "b c"], "max_tokens": -4}, Demand(3, 1, 2)),
    ],
)
def test_a_demand_reads_every_field_as_vllm_does(path: str, body: dict, expected: Demand) -> None:
    assert request_demand(path, body, words, context_tokens=100) == expected


def test_a_cut_sets_the_limit_vllm_reads_first_and_lowers_min_tokens() -> None:
    chat = {"messages": HELLO, "max_tokens": 500, "min_tokens": "300"}
    assert with_answer_limit(CHAT, chat, 40) == {**chat, "max_completion_tokens": 40, "min_tokens": 40}
    assert with_answer_limit(COMPLETIONS, {"prompt": "x", "min_tokens": 5}, 40)["max_tokens"] == 40
    assert with_answer_limit(COMPLETIONS, {"prompt": "x", "min_tokens": 5}, 40)["min_tokens"] == 5


def test_the_minute_counts_running_answers_in_full_and_says_when_there_is_room() -> None:
    clock = FakeClock()
    limits = UserLimits(Settings.from_env({"USER_TOKENS_PER_MINUTE": "1000"}), clock)
    usage = limits.usage(user_key("ann"))
    limits.record_tokens(usage, 600)
    clock.now += 30
    usage.reserved_tokens = 300
    minute = limits.tokens_room(usage)
    assert minute is not None and minute.tokens == 100 and not minute.counts_prompt
    refusal = minute.refusal(150)
    assert refusal.reason == USER_TOKENS_PER_MINUTE and "needs at least 150" in str(refusal)
    assert refusal.retry_after_seconds == 31, "when the 600 received 30 s ago have aged out"
    assert UserLimits(Settings.from_env({"USER_TOKENS_PER_MINUTE": "0"})).tokens_room(usage) is None


def test_budget_rooms_count_what_running_requests_hold_and_say_when_they_reset() -> None:
    month, day = budget_rooms(Budget(day=1000, month=50_000), 900, 40_000, 60, NOW)
    assert (month.tokens, day.tokens) == (9_940, 40) and day.counts_prompt
    short = day.refusal(100)
    assert short.reason == QUOTA_DAY and short.retry_after_seconds == 12 * 3600
    assert "needs up to 100 tokens" in str(short) and "40 of your 1,000 tokens for today (UTC)" in str(short)
    assert "(60 more are held by answers still running)" in str(short)
    assert "none left" in str(budget_rooms(Budget(day=10), 10, 0, 0, NOW)[0].refusal(1))
    assert month.refusal(1).reason == QUOTA_MONTH
    assert budget_rooms(Budget(), 900, 900, 0, NOW) == [], "no budget, nothing to check"


@pytest.mark.asyncio
async def test_what_a_request_holds_is_given_back_on_every_exit() -> None:
    store = MemoryUsageStore()
    store.day_budgets["bo"], store.spent["bo"] = 1000, (700, 700)
    settings = NO_LINE.replace(user_tokens_per_minute=5000)
    ledger = UsageLedger(settings, store, clock=lambda: NOW, monotonic=FakeClock())
    admission = Admission(settings, EngineLoad(), max_running=64, accounting=ledger)
    usage = admission.limits.usage(user_key("bo"))
    async with admission.admit(API, user_key("bo"), lambda: Demand(10, 200, 1)) as first:
        assert first.grant.cut is None and ledger.reserved == {"bo": 210} and usage.reserved_tokens == 200
        with pytest.raises(RuntimeError):
            async with admission.admit(API, user_key("bo"), lambda: Demand(10, 200, 1)) as second:
                assert second.grant.cut == 80, "what the first left: 300 - 210 - 10"
                raise RuntimeError("the request failed")
        assert ledger.reserved == {"bo": 210} and usage.reserved_tokens == 200
        first.used(10, 50)  # it ended early: its actual tokens count instead of what it held
    assert ledger.reserved == {} and usage.reserved_tokens == 0
    assert ledger.running["bo"].day_tokens == 760
    with pytest.raises(Refused):
        async with admission.admit(API, user_key("bo"), lambda: Demand(300, 1, 1)):
            pytest.fail("a prompt larger than what is left must not run")
    assert ledger.reserved == {} and admission.line.refusals[QUOTA_DAY] == 1


@pytest.mark.asyncio
async def test_a_chat_turn_refused_for_its_tokens_is_a_refusal_not_a_turn() -> None:
    store = MemoryUsageStore()
    store.day_budgets["cy"], store.spent["cy"] = 100, (95, 95)
    ledger = UsageLedger(NO_LINE, store, clock=lambda: NOW, monotonic=FakeClock())
    admission = Admission(NO_LINE, EngineLoad(), max_running=64, accounting=ledger)
    chat = admission.engine(WordEngine(), CHAT_TURN)  # type: ignore[arg-type]
    sampling = SamplingSettings(temperature=0.7, top_p=0.9, max_new_tokens=48)
    with pytest.raises(Refused) as refused:
        async with admission.turn(user_key("cy"), documents=1):
            async for _ in chat.generate([{"role": "user", "content": "one two three"}], sampling, "r"):
                pytest.fail("4 prompt tokens and 16 answer tokens do not fit in the 5 left")
    assert refused.value.reason == QUOTA_DAY
    async with admission.turn(user_key("cy")):
        pass  # a turn that asks the engine nothing (an unreadable file, say) counts as before
    counted = dict(zip(USAGE_COUNTERS, ledger.batch.rows[("cy", "2026-12-10")], strict=True))
    assert (counted["turns"], counted["documents"], counted["refusals"]) == (1, 0, 1), counted
