"""Budget planning picks the path the numbers say; prompts for follow-ups keep a whole document whole.

Pure logic: the engine here counts words as tokens, so every number is checkable by hand.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator

import pytest

from harness.waiting import until
from services.chat import prompt as prompt_module
from services.chat.prompt import PromptBuilder
from services.chat.session import ChatSession, SessionDocument
from services.config import Settings
from services.documents.planning import IN_PARTS, WHOLE, Budget, plan_document
from services.documents.progress import SummaryProgress
from services.engine.chat_engine import Message, SamplingSettings
from services.engine.prefill import PrefillMeter, tick_until_first
from services.engine.stream_stats import StreamStats
from tests.fakes import WordEngine

BUDGET = Budget(
    max_model_len=8192,
    summary_tokens=400,
    follow_up_turns=3,
    follow_up_turn_tokens=256,
    single_pass_max_tokens=100_000,
)  # fmt: skip  (reserved: 400 + 3 * 256 = 1,168 tokens)


def test_reserved_room_is_the_summary_and_the_follow_up_turns() -> None:
    assert BUDGET.reserved_tokens == 1168


def test_a_document_that_fits_with_its_reserve_is_read_whole() -> None:
    plan = plan_document(document_tokens=6900, prompt_tokens=8192 - 1168, budget=BUDGET)
    assert plan.path == WHOLE and plan.whole and plan.fits
    assert plan.note("a.txt") is None


def test_one_token_more_and_it_is_read_in_parts_and_the_user_told_why() -> None:
    plan = plan_document(document_tokens=6901, prompt_tokens=8192 - 1168 + 1, budget=BUDGET)
    assert plan.path == IN_PARTS and not plan.fits
    note = plan.note("report.txt")
    assert note is not None
    assert "«report.txt» has 6,901 tokens" in note
    assert "3 follow-up questions" in note and "8,192-token context" in note
    assert "map-reduce" in note and "retrieval" in note


def test_the_issue_case_a_7700_token_text_that_fits_alone_is_read_in_parts() -> None:
    # 7,700 tokens + a 400-token summary fit 8,192, but no follow-up turn would: before this
    # plan it was summarized in one pass and every question then lost the cached prefix.
    plan = plan_document(document_tokens=7700, prompt_tokens=7760, budget=BUDGET)
    assert 7760 + BUDGET.summary_tokens <= BUDGET.max_model_len
    assert plan.path == IN_PARTS


def test_a_document_past_the_speed_threshold_is_read_in_parts_even_when_it_fits() -> None:
    fast = Budget(8192, 400, 3, 256, single_pass_max_tokens=3000)
    plan = plan_document(document_tokens=3001, prompt_tokens=3060, budget=fast)
    assert plan.fits and plan.path == IN_PARTS
    assert "from 3,000 tokens on" in (plan.note("x") or "")
    assert plan_document(3000, 3059, fast).path == WHOLE


def test_no_follow_up_reserve_is_the_old_rule() -> None:
    old = Budget(8192, 400, 0, 256, 100_000)
    assert plan_document(7700, 7760, old).path == WHOLE
    assert plan_document(7900, 7793, old).path == IN_PARTS


# --- follow-up prompts: a whole document stays the prefix -----------------------------
def session_with(document_words: int, path: str, history_pairs: int) -> ChatSession:
    text = " ".join(f"w{i}" for i in range(document_words))
    budget = Budget(1000, 100, 2, 60, 100_000)
    plan = plan_document(document_words, document_words + 40, budget)
    assert plan.path == path
    history: deque[Message] = deque(maxlen=200)
    for n in range(history_pairs):
        history.extend([{"role": "user", "content": f"question {n} " * 10},
                        {"role": "assistant", "content": f"answer {n} " * 40}])  # fmt: skip
    return ChatSession(
        "s", SamplingSettings(0.2, 0.9, 200), "Be brief.", history,
        document=SessionDocument("doc.txt", text, document_words, plan=plan),
    )  # fmt: skip


@pytest.fixture
def builder(monkeypatch: pytest.MonkeyPatch) -> PromptBuilder:
    monkeypatch.setattr(prompt_module, "FOLLOW_UP_TURN_TOKENS", 60)
    monkeypatch.setattr(prompt_module, "RETRIEVAL_TOP_K", 2)
    settings = Settings.from_env({}).replace(max_model_len=1000)
    return PromptBuilder(WordEngine(max_model_len=1000, message_overhead_tokens=4), settings)  # type: ignore[arg-type]


def test_a_whole_document_stays_whole_and_the_history_gives_way(builder: PromptBuilder) -> None:
    session = session_with(document_words=600, path=WHOLE, history_pairs=6)
    prompt = builder.build(session, "What is w5?")
    assert "w599" in prompt.messages[0]["content"]  # the whole document, first: the cached prefix
    assert prompt.dropped_messages > 0
    assert len(builder.engine.encode_chat(prompt.messages)) <= 1000 - 60


def test_a_document_in_parts_is_questioned_through_excerpts(builder: PromptBuilder) -> None:
    session = session_with(document_words=900, path=IN_PARTS, history_pairs=0)
    prompt = builder.build(session, "What is w5?")
    assert "excerpts most relevant" in prompt.messages[0]["content"]


# --- progress: tokens read, estimated from the measured prefill speed ----------------
def prefill(tokens: int, seconds: float, cached: int = 0) -> StreamStats:
    stats = StreamStats("r", prompt_tokens=tokens, submitted_at=0.0, cached_tokens=cached, queue_seconds=0.0)
    stats.first_token_at = seconds
    return stats


def test_the_meter_fits_prefill_time_and_bends_for_long_prompts() -> None:
    meter = PrefillMeter()
    assert meter.seconds_for(1000) is None
    for tokens in (500, 1000, 2000, 4000):
        meter.observe(prefill(tokens, tokens / 150 + (tokens / 6000) ** 2 * 10))
    assert meter.seconds_for(2000) == pytest.approx(2000 / 150 + (2000 / 6000) ** 2 * 10, rel=0.01)
    assert meter.seconds_for(8000) > 4 * meter.seconds_for(2000)  # attention: longer is slower per token


def test_the_meter_ignores_short_and_cached_prefills() -> None:
    meter = PrefillMeter()
    meter.observe(prefill(100, 1.0))
    meter.observe(prefill(5000, 1.0, cached=4900))
    assert not meter.measured


def test_tokens_read_grow_with_time_and_never_claim_the_end() -> None:
    meter = PrefillMeter()
    meter.observe(prefill(1000, 10.0))  # 100 tokens/s
    assert meter.tokens_read(20.0, 7000, 7000) == 2000
    assert meter.tokens_read(10_000.0, 7000, 7000) == 6930


def test_progress_reads_as_a_person_expects() -> None:
    assert SummaryProgress(7700, None, 12.0).describe() == "Reading 7,700 tokens… (12 s)"
    text = SummaryProgress(7700, 3100, 31.0, parts_total=4, parts_done=1, parts_looped=1).describe()
    assert text.startswith("Read ~3,100 of 7,700 tokens (40%, 31 s); 1 of 4 parts summarized")
    assert "1 part's summary started repeating itself and was stopped" in text


def test_the_last_report_gives_the_real_numbers() -> None:
    assert SummaryProgress(7700, 7700, 62.0, finished=True).describe() == "Read 7,700 tokens in 62 s."
    parts = SummaryProgress(20000, 20000, 95.0, parts_total=10, parts_done=10, finished=True).describe()
    assert parts == "Read 20,000 tokens in 10 parts in 95 s."


async def slow_then_fast(first_after: asyncio.Event) -> AsyncIterator[str]:
    await first_after.wait()
    for word in ("one", "two", "three"):
        yield word
        await asyncio.sleep(0.1)  # two ticks' time: a ticker still running would tick again


@pytest.mark.asyncio
async def test_the_ticker_ticks_only_until_the_first_words() -> None:
    """The first word comes right after the third tick (an event, not a time: a busy machine wakes
    the ticker late), then the words take longer than a tick: no tick comes after the first word."""
    ticks: list[float] = []
    third_tick = asyncio.Event()

    async def tick() -> None:
        ticks.append(asyncio.get_running_loop().time())
        if len(ticks) == 3:
            third_tick.set()

    words = [w async for w in tick_until_first(slow_then_fast(third_tick), tick, interval_seconds=0.05)]
    assert words == ["one", "two", "three"]
    assert len(ticks) == 3
    assert not [t for t in asyncio.all_tasks() if t.get_name() == "reading-progress"]


@pytest.mark.asyncio
async def test_cancelling_the_reader_stops_the_ticker_and_the_stream() -> None:
    closed = asyncio.Event()

    async def endless() -> AsyncIterator[str]:
        try:
            await asyncio.sleep(60)
            yield "never"
        finally:
            closed.set()

    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        ticks += 1
        raise RuntimeError("a broken progress report is logged, not raised")

    async def read() -> None:
        async for _ in tick_until_first(endless(), tick, interval_seconds=0.05):
            pass

    task = asyncio.create_task(read())
    await until(lambda: ticks >= 2, "a tick after a broken one")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert closed.is_set()
    assert not [t for t in asyncio.all_tasks() if t.get_name() == "reading-progress"]
