"""Admission rules (pure logic): queue order and bounds, the capacity model, per-user limits, feedback,
prefix affinity. The real engine and server path of the same rules is in test_overload.py."""

from __future__ import annotations

import asyncio
import time
import types
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from harness.waiting import until
from services.admission import feedback as feedback_module
from services.admission.capacity import DecodeCapacity
from services.admission.context import TurnContext
from services.admission.feedback import QUIET_SECONDS, WaitingFeedback, status_text
from services.admission.limits import UserLimits, user_key
from services.admission.other_replicas import OtherReplicas
from services.admission.pace import ADJUST_SECONDS, PROBE_SECONDS
from services.admission.promises import MAX_KEPT, MIN_TURNS, PROMISE_WINDOW_SECONDS, WaitPromises
from services.admission.refusals import WAIT_TOO_LONG, Refused, busy, rounded_seconds
from services.admission.service import Admission
from services.admission.tickets import Ticket, engine_priority
from services.admission.waiting_line import API, CHAT, DOCUMENT, WaitingLine
from services.config import Settings
from services.engine.backends.remote import Server, prefix_hashes, servers_to_try
from services.engine.chat_engine import SamplingSettings
from services.engine.load import EngineLoad, LoadWindow
from tests.fakes import FakeClock, WordEngine

aio = pytest.mark.asyncio(loop_scope="function")


class FixedCapacity(DecodeCapacity):
    """A capacity whose limit the test sets."""

    def __init__(self, limit: int) -> None:
        super().__init__(5.0, 64)
        self.fixed = limit

    @property
    def limit(self) -> int:
        return self.fixed


def settings(**changes) -> Settings:
    return Settings.from_env({}).replace(**changes)


def line_with(limit: int, clock: FakeClock | None = None, max_prefilling: int = 0, **changes) -> WaitingLine:
    """A line of `limit` slots; `max_prefilling` 0: no tokens stream here, unless a test sends them."""
    changes.setdefault("admission_max_wait_seconds", 1000)  # these tests queue turns on purpose
    return WaitingLine(settings(**changes), FixedCapacity(limit), clock or FakeClock(), max_prefilling)


def priority(line: WaitingLine, ticket: Ticket) -> int:
    """The vLLM priority an admitted request of `line` is sent with."""
    return engine_priority(line.settings, ticket.key)


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


class Queue:
    """Requests taking their place in one line, each held until `finish`; records the order in which
    they were admitted."""

    def __init__(self, line: WaitingLine, clock: FakeClock) -> None:
        self.line, self.clock = line, clock
        self.admitted: list[str] = []
        self.places: dict[str, object] = {}  # what `place` yielded, once admitted
        self.done: dict[str, asyncio.Event] = {}
        self.tasks: dict[str, asyncio.Task] = {}

    async def submit(self, name: str, kind: str, after_seconds: float = 1.0, owner: object = None) -> None:
        self.clock.now += after_seconds
        done = self.done[name] = asyncio.Event()

        async def hold() -> None:
            async with self.line.place(kind, owner=owner) as place:
                self.places[name] = place
                self.admitted.append(name)
                await done.wait()

        self.tasks[name] = asyncio.create_task(hold())
        await settle()

    async def finish(self, *names: str) -> None:
        for name in names:
            self.done[name].set()
        await settle()


@aio
async def test_requests_beyond_the_limit_wait_and_chat_goes_before_documents() -> None:
    clock = FakeClock()
    queue = Queue(line_with(2, clock, document_slot_share=1.0), clock)
    for name, kind in (("doc-1", DOCUMENT), ("doc-2", DOCUMENT), ("doc-3", DOCUMENT), ("chat-1", CHAT)):
        await queue.submit(name, kind)
    await queue.submit("doc-4", DOCUMENT)
    await queue.submit("chat-2", CHAT)
    assert queue.admitted == ["doc-1", "doc-2"] and len(queue.line.waiting) == 4
    assert queue.line.engine_running == 2
    await queue.finish("doc-1", "doc-2")
    assert queue.admitted[2:] == ["chat-1", "chat-2"], "chat turns take the freed slots first"
    await queue.finish("chat-1", "chat-2")
    assert queue.admitted[4:] == ["doc-3", "doc-4"]
    await queue.finish("doc-3", "doc-4")
    assert queue.line.engine_running == 0 and not queue.line.waiting


@aio
async def test_document_parts_hold_only_their_share_and_chat_passes_the_rest() -> None:
    clock = FakeClock()
    queue = Queue(line_with(4, clock, document_slot_share=0.25, document_aging_seconds=0), clock)
    summary = object()  # the turn doc-3 belongs to
    for name in ("doc-1", "doc-2", "doc-3"):
        await queue.submit(name, DOCUMENT, owner=summary if name == "doc-3" else None)
    assert queue.admitted == ["doc-1"], "one of four slots for documents"
    await queue.submit("chat-1", CHAT, after_seconds=60)  # behind the waiting parts, yet it runs
    await queue.submit("chat-2", CHAT)
    assert queue.admitted == ["doc-1", "chat-1", "chat-2"]
    ahead, estimate = queue.line.place_of(summary)
    assert ahead == 1 and estimate > 0
    await queue.finish("doc-1")
    assert queue.admitted[3:] == ["doc-2"], "the next part takes the documents' slot"
    await queue.finish("chat-1", "chat-2", "doc-2")
    await queue.finish("doc-3")
    assert queue.line.engine_running == 0 and not queue.line.waiting


@aio
async def test_a_burst_is_read_a_few_prompts_at_a_time_and_documents_one_of_them() -> None:
    clock = FakeClock()
    queue = Queue(line_with(8, clock, max_prefilling=2, document_slot_share=0.5), clock)
    for name, kind in (("doc-1", DOCUMENT), ("doc-2", DOCUMENT), ("chat-1", CHAT), ("chat-2", CHAT)):
        await queue.submit(name, kind, after_seconds=0)
    assert queue.admitted == ["doc-1", "chat-1"], "two prompts read at once, one of them a document's"
    queue.line.note_token(queue.places["chat-1"])  # its first token: its prompt is read
    await settle()
    assert queue.admitted[2:] == ["chat-2"], "the next prompt is read; the second part still waits"
    queue.line.note_token(queue.places["chat-1"])
    queue.line.note_token(queue.places["chat-2"])
    await settle()
    assert queue.admitted[3:] == [], "one document prompt at a time"
    queue.line.note_token(queue.places["doc-1"])
    await settle()
    assert queue.admitted[3:] == ["doc-2"] and queue.line.engine_running == 4
    await queue.finish("doc-2")  # released before its first token (stopped, say): its place frees
    await queue.submit("chat-3", CHAT)
    await queue.submit("chat-4", CHAT)
    assert queue.admitted[4:] == ["chat-3", "chat-4"]
    await queue.finish("doc-1", "chat-1", "chat-2", "chat-3", "chat-4")
    assert queue.line.engine_running == 0 and not queue.line.waiting


@aio
async def test_other_replicas_document_parts_hold_the_documents_share_and_prefill() -> None:
    """N replicas at one engine: their parts count against the one share and the one document
    prefill, so documents do not hold N times their share of the engine."""
    clock = FakeClock()
    queue = Queue(line_with(8, clock, max_prefilling=2, document_slot_share=0.25), clock)
    line = queue.line
    line.others = OtherReplicas(running=1, documents=1, documents_prefilling=1)
    await queue.submit("doc-1", DOCUMENT, after_seconds=0)
    await queue.submit("chat-1", CHAT)
    assert queue.admitted == ["chat-1"], "the other replica's part reads its prompt: ours waits"
    line.others = OtherReplicas(running=1, documents=1)  # its prompt is read; it holds a slot of two
    line.admit_waiting()
    await settle()
    assert queue.admitted == ["chat-1", "doc-1"], "8 x 0.25: two document slots, one of them ours"
    await queue.submit("doc-2", DOCUMENT, after_seconds=0)
    line.note_token(queue.places["doc-1"])
    await settle()
    assert queue.admitted[2:] == [], "the documents' slots are full at the engine"
    line.others = OtherReplicas()
    line.admit_waiting()
    await settle()
    assert queue.admitted[2:] == ["doc-2"]
    await queue.finish("chat-1", "doc-1", "doc-2")


@aio
async def test_at_a_limit_of_one_a_document_part_does_not_keep_chat_out() -> None:
    clock = FakeClock()
    queue = Queue(line_with(1, clock, document_slot_share=0.25, document_aging_seconds=0), clock)
    await queue.submit("doc-1", DOCUMENT)
    await queue.submit("doc-2", DOCUMENT)  # waits, ahead of the chat turns: it came first
    await queue.submit("chat-1", CHAT, after_seconds=5)
    await queue.submit("chat-2", CHAT)
    assert queue.admitted == ["doc-1", "chat-1"], "one chat turn runs beside the part; the rest wait"
    await queue.finish("chat-1")
    assert queue.admitted[2:] == ["chat-2"]
    await queue.finish("doc-1")
    assert queue.admitted[3:] == [], "the limit is full with chat running"
    await queue.finish("chat-2")
    assert queue.admitted[3:] == ["doc-2"]
    await queue.finish("doc-2")
    assert queue.line.engine_running == 0 and not queue.line.waiting


@aio
async def test_at_a_limit_of_one_another_replicas_document_part_does_not_keep_chat_out() -> None:
    clock = FakeClock()
    queue = Queue(line_with(1, clock, document_slot_share=0.25, document_aging_seconds=0), clock)
    line = queue.line
    line.others, line.foreign = OtherReplicas(running=1, documents=1), 1  # its part holds the one slot
    await queue.submit("doc", DOCUMENT)
    await queue.submit("chat-1", CHAT)
    assert queue.admitted == ["chat-1"], "one chat turn runs beside the other replica's part"
    await queue.submit("chat-2", CHAT)
    assert queue.admitted == ["chat-1"], "with a chat turn running beside the part, the rest wait"
    line.others, line.foreign = OtherReplicas(running=2, documents=1), 2  # a chat turn runs there too
    await queue.finish("chat-1")
    assert queue.admitted == ["chat-1"], "its chat turn runs beside the part: ours waits"
    line.others, line.foreign = OtherReplicas(), 0  # the other replica's requests ended
    line.admit_waiting()
    await settle()
    assert queue.admitted == ["chat-1", "doc", "chat-2"], "ours in order: the part, and a chat beside it"
    await queue.finish("chat-2", "doc")
    assert line.engine_running == 0 and not line.waiting


@aio
async def test_aging_keeps_later_chat_from_starving_a_document_part() -> None:
    clock = FakeClock()
    queue = Queue(line_with(1, clock, document_aging_seconds=30), clock)
    await queue.submit("running", CHAT)
    await queue.submit("doc", DOCUMENT)
    await queue.submit("chat-soon", CHAT, after_seconds=10)  # 10 s later: still goes first
    await queue.submit("chat-late", CHAT, after_seconds=25)  # 35 s after the doc: goes after it
    await queue.finish("running")
    await queue.finish("chat-soon")
    await queue.finish("doc")
    assert queue.admitted == ["running", "chat-soon", "doc", "chat-late"]
    await queue.finish("chat-late")


@aio
async def test_with_priority_off_it_is_first_come_first_served() -> None:
    clock = FakeClock()
    line = line_with(1, clock, priority_scheduling=False)
    queue = Queue(line, clock)
    for name, kind in (("a", CHAT), ("doc", DOCUMENT), ("b", CHAT), ("api", API)):
        await queue.submit(name, kind)
    await queue.finish("a")
    await queue.finish("doc")
    await queue.finish("b")
    assert queue.admitted == ["a", "doc", "b", "api"]
    assert priority(line, queue.places["doc"]) == priority(line, queue.places["api"]) == 0
    await queue.finish("api")


@aio
async def test_vllm_priority_puts_chat_before_a_document_part_of_the_same_moment() -> None:
    clock = FakeClock()
    line = line_with(8, clock, document_aging_seconds=30, api_aging_seconds=10)
    queue = Queue(line, clock)
    for name, kind in (("chat", CHAT), ("doc", DOCUMENT), ("api", API)):
        await queue.submit(name, kind, after_seconds=0)
    chat, document, api = (priority(line, queue.places[name]) for name in ("chat", "doc", "api"))
    assert chat < api < document <= chat + 30
    await queue.finish("chat", "doc", "api")


@aio
async def test_a_full_queue_refuses_at_once_with_place_and_retry_time() -> None:
    clock = FakeClock()
    queue = Queue(line_with(1, clock, admission_queue_max=2), clock)
    for name in ("running", "w1", "w2"):
        await queue.submit(name, CHAT)
    with pytest.raises(Refused) as refused:
        async with queue.line.place(CHAT):
            pass
    message = str(refused.value)
    assert refused.value.reason == "queue_full" and queue.line.refusals["queue_full"] == 1
    assert "busy: 2 requests are waiting ahead of yours" in message and "try again in ~" in message
    assert refused.value.retry_after_seconds and refused.value.retry_after_seconds > 0
    await queue.finish("running")
    await queue.finish("w1")
    await queue.finish("w2")
    assert queue.admitted == ["running", "w1", "w2"], "the waiting ones were not disturbed"


@aio
async def test_a_chat_turn_facing_too_long_a_wait_is_refused_once_turns_were_measured() -> None:
    clock = FakeClock()
    line = line_with(1, clock, admission_max_wait_seconds=30)
    queue = Queue(line, clock)
    await queue.submit("running", CHAT)
    await queue.submit("unmeasured", CHAT)
    assert len(line.waiting) == 1, "before turns were measured, one round of the limit may wait"
    with pytest.raises(Refused, match="busy") as early:
        async with line.place(CHAT):  # a second round on a guess: refused
            pass
    assert early.value.reason == "wait_too_long"
    clock.now += 20
    await queue.finish("running")  # "unmeasured" runs
    await queue.submit("next", CHAT, after_seconds=0)  # one round again: it may wait
    assert len(line.waiting) == 1
    for name in ("unmeasured", "next"):
        clock.now += 20
        await queue.finish(name)
    await queue.submit("long", CHAT)
    await queue.submit("w1", CHAT)  # about one turn (~24 s) away: fine
    assert len(line.waiting) == 1
    with pytest.raises(Refused, match="busy") as refused:
        async with line.place(CHAT):  # two turns away
            pass
    assert refused.value.reason == "wait_too_long" and refused.value.retry_after_seconds > 30
    await queue.finish("long", "w1")


@pytest.mark.parametrize(
    ("ahead", "said"),
    [
        (0, "The service is busy: every place is taken by requests already running. "),
        (1, "The service is busy: 1 request is waiting ahead of yours. "),
        (7, "The service is busy: 7 requests are waiting ahead of yours. "),
    ],
)
def test_a_busy_refusal_says_what_holds_the_service_up_in_plain_words(ahead: int, said: str) -> None:
    message = str(busy(WAIT_TOO_LONG, ahead, 42))
    assert message == said + "Please try again in ~45 s."


@aio
async def test_a_turn_refused_with_nobody_waiting_ahead_is_not_told_of_0_requests() -> None:
    """Nothing waits, but the one running turn takes longer than the longest wait allowed."""
    clock = FakeClock()
    line = line_with(1, clock, admission_max_wait_seconds=30)
    queue = Queue(line, clock)
    for number in range(4):  # turns of 60 s each, measured
        await queue.submit(f"t{number}", CHAT)
        clock.now += 60
        await queue.finish(f"t{number}")
    await queue.submit("running", CHAT)
    assert not line.waiting
    with pytest.raises(Refused) as refused:
        async with line.place(CHAT):
            pass
    assert refused.value.reason == "wait_too_long"
    assert "every place is taken by requests already running" in str(refused.value)
    assert "0 request" not in str(refused.value)
    await queue.finish("running")


@aio
async def test_a_cancelled_waiter_leaves_the_queue_and_an_admitted_one_frees_its_slot() -> None:
    clock = FakeClock()
    queue = Queue(line_with(1, clock), clock)
    await queue.submit("running", CHAT)
    await queue.submit("gone", CHAT)
    queue.tasks["gone"].cancel()
    await settle()
    assert not queue.line.waiting
    await queue.submit("next", CHAT)
    queue.done["running"].set()
    await asyncio.sleep(0)  # "running" gives its slot back, which admits "next"...
    assert queue.admitted == ["running"] and queue.line.engine_running == 1
    queue.tasks["next"].cancel()  # ...which is cancelled before it resumes
    await settle()
    assert queue.admitted == ["running"] and queue.line.engine_running == 0, "the slot came back"


@aio
async def test_service_times_are_measured_per_kind_and_feed_the_estimate() -> None:
    clock = FakeClock()
    line = line_with(1, clock)
    async with line.place(CHAT):
        clock.now += 100
    assert line.service_seconds[CHAT] > 15, "a slow chat turn raised the measured service time"
    assert line.estimate_seconds(0) == 0  # nothing running, nothing ahead
    assert rounded_seconds(8.2) == "9 s" and rounded_seconds(41) == "45 s" and rounded_seconds(61) == "2 min"


@aio
async def test_turns_that_get_their_first_token_later_than_promised_make_estimates_longer() -> None:
    clock = FakeClock()
    line = line_with(1, clock, admission_max_wait_seconds=40, max_prefilling=4)
    queue = Queue(line, clock)
    for index in range(3):  # turns measured: the estimate alone decides
        await queue.submit(f"m{index}", CHAT)
        clock.now += 20
        await queue.finish(f"m{index}")
    await queue.submit("running", CHAT)
    await queue.submit("waiting", CHAT, after_seconds=0)
    told = line.estimate_seconds(0)
    assert line.waiting[0].promised == pytest.approx(told) and told > 0, "the wait it was told is kept"
    clock.now += told + 30  # the running turn's first token comes 30 s after its promise of none
    line.note_token(queue.places["running"])
    assert line.promises.status()["actual_p50"] == pytest.approx(told + 30, abs=0.01)
    await queue.finish("running")
    clock.now += 1
    line.note_token(queue.places["waiting"])  # 31 s later than it was told
    assert line.promises.late_seconds == 0, "two late turns are not yet a trend"
    line.promises.keep(5.0, 40.0)
    status = line.promises.status()
    assert status["turns"] == MIN_TURNS and status["late_seconds"] > 25, status
    assert status["actual_p95"] > status["promised_p95"]
    estimate = line.estimate_seconds(0)
    assert estimate > 40, "the next turn's estimate carries the lateness"
    with pytest.raises(Refused, match="busy") as refused:
        async with line.place(CHAT):  # behind the running turn: ~20 s of its own, too long with it
            pass
    assert refused.value.reason == "wait_too_long"
    clock.now += PROMISE_WINDOW_SECONDS + 1  # the late turns age out: estimates are the line's own
    assert line.promises.late_seconds == 0 and line.estimate_seconds(0) < 40
    await queue.finish("waiting")


def test_promises_are_bounded_and_need_a_few_turns() -> None:
    clock = FakeClock()
    promises = WaitPromises(clock)
    promises.keep(1.0, 50.0)
    assert promises.late_seconds == 0, "one late turn is not a trend"
    for _ in range(MAX_KEPT * 2):
        promises.keep(1.0, 2.0)
    assert len(promises._recent()) == MAX_KEPT
    assert promises.late_seconds == pytest.approx(1.0)
    assert promises.status()["promised_p50"] == 1.0 and promises.status()["actual_p99"] == 2.0


# --- the capacity model ----------------------------------------------------------------------
def test_the_running_limit_follows_from_measured_step_times() -> None:
    capacity = DecodeCapacity(pace_tokens_per_second=5.0, max_running=64)
    assert capacity.limit == 1, "nothing measured: one at a time"
    for size in (1, 2, 4, 8):  # 0.05 s + 0.02 s per stream: pace 5/s holds up to 7 streams
        capacity.observe_batch(size, 0.05 + 0.02 * size, busy_seconds=5)
    intercept, slope = capacity.line()
    assert intercept == pytest.approx(0.05) and slope == pytest.approx(0.02)
    assert capacity.limit == 7
    capacity.observe_batch(8, 0.6, busy_seconds=30)  # a document's prefill slows the steps down
    assert capacity.limit < 7


def test_with_a_warm_up_live_windows_scale_its_line_by_their_median() -> None:
    capacity = DecodeCapacity(pace_tokens_per_second=5.0, max_running=64)
    capacity.set_baseline({1: 0.06, 2: 0.08, 4: 0.12, 8: 0.2})  # 0.04 s + 0.02 s per stream
    assert capacity.limit == 8, "the warm-up's line: 8 streams keep 5 tokens/s"

    def window(running: int, seconds_per_token: float, at: float) -> LoadWindow:
        busy = 10 * seconds_per_token  # ten tokens per stream
        return LoadWindow(ended_at=at, seconds=busy, busy_seconds=busy, running=running, waiting=0,
                          generation_tokens=10 * running, prompt_tokens=0)  # fmt: skip

    for at in range(6):  # steps take twice the warm-up's, whatever the batch
        capacity.observe(window(2 + at % 3, 2 * (0.04 + 0.02 * (2 + at % 3)), float(at)))
    assert capacity.slowdown == pytest.approx(2, rel=0.05) and capacity.limit == 3
    for at in range(6, 9):  # a few wild windows (a prefill chunk, a stall) do not move the median
        capacity.observe(window(1, 2.0, float(at)))
    assert capacity.limit == 3
    for at in range(9, 60):  # an engine many times slower still admits one at a time, not zero
        capacity.observe(window(1, 5.0, float(at)))
    assert capacity.slowdown == 4.0 and capacity.limit == 1


def paced_line(limit: int, count: int) -> tuple[FakeClock, WaitingLine, list[object], Callable[..., None]]:
    """A line at `limit`, `count` streams, and a function that streams tokens to them for a while."""
    clock = FakeClock()
    line = line_with(limit, clock)
    streams = [object() for _ in range(count)]
    return clock, line, streams, streaming(line, clock, streams)


def streaming(line: WaitingLine, clock: FakeClock, streams: list[object]) -> Callable[..., None]:
    """A function that streams tokens to `streams` at a rate for some seconds of `clock`."""

    def stream_for(seconds: float, tokens_per_second: float, among=streams) -> None:
        due = 0.0
        for _ in range(round(seconds * 10)):  # tenths of a second
            clock.now += 0.1
            due += 0.1 * tokens_per_second
            while due >= 1 - 1e-9:
                due -= 1
                for stream in among:
                    line.pace.token(stream)

    return stream_for


def test_streams_slower_than_the_pace_lower_the_limit_and_fast_ones_raise_it_back() -> None:
    clock, line, streams, stream_for = paced_line(6, 6)
    pace = line.pace

    stream_for(2, 3.0)
    assert pace.slowest() is None, "streams younger than a few seconds have no pace yet"
    stream_for(8, 3.0)  # six streams at 3 tokens/s, under the pace of 5 (prefill slowing the steps)
    assert pace.slowest() == pytest.approx(3.0, abs=0.3)
    pace.adjust(running=6, model_limit=6)
    assert line.limit == 3 and pace.lowered_total == 1, "6 streams at 3/5 of the pace: 3 keep it"
    stream_for(5.5, 4.5)
    pace.adjust(running=6, model_limit=6)
    assert line.limit == 3, "never above the cap it had"
    stream_for(5.5, 4.8)
    pace.adjust(running=4, model_limit=6)
    assert line.limit == 3 and pace.lowered_total == 3, "at least one below what runs"
    pace.adjust(running=3, model_limit=6)
    assert line.limit == 3, "one move per ADJUST_SECONDS: each change gets time to show"
    stream_for(5.5, 4.8)
    pace.adjust(running=4, model_limit=6)
    assert line.limit == 3
    pace.cap = 4  # as if it had risen meanwhile
    for stream in streams[4:]:
        pace.ended(stream)
    assert len(pace) == 4, "ended streams are forgotten"
    stream_for(11, 10.0, streams[:4])  # four streams now keep twice the pace
    pace.adjust(running=4, model_limit=6)
    assert line.limit == 5
    stream_for(5.5, 10.0, streams[:4])
    pace.adjust(running=4, model_limit=6)
    assert line.limit == 5, "raised only while the cap is reached"
    pace.adjust(running=5, model_limit=6)
    assert line.limit == 6 and pace.cap is None, "back at the model's limit: no cap"
    off = line_with(6, clock, reading_pace_tokens_per_second=0).pace
    off.token(streams[0])
    clock.now += 30
    off.adjust(running=6, model_limit=6)
    assert off.cap is None, "pace 0: admission is off"


def test_a_cap_held_while_streams_keep_the_pace_probes_one_more_and_falls_back_if_they_slow() -> None:
    _, line, streams, stream_for = paced_line(12, 12)
    pace = line.pace
    stream_for(10, 1.0)  # a burst slowed by something passing: 12 streams at 1 token/s
    pace.adjust(running=12, model_limit=12)
    assert pace.cap == 2, "12 streams at 1/5.5 of the pace: 2 keep it"
    for stream in streams[2:]:
        pace.ended(stream)
    stream_for(10, 6.0, streams[:2])  # then the engine is quick again: the pace, not 1.5 times it
    pace.adjust(running=2, model_limit=12)
    assert pace.cap == 2, "no probe before PROBE_SECONDS"
    stream_for(PROBE_SECONDS - 9.9, 6.0, streams[:2])
    pace.adjust(running=1, model_limit=12)
    assert pace.cap == 2, "only while the cap is reached"
    pace.adjust(running=2, model_limit=12)
    assert pace.cap == 3 and line.limit == 3, "held PROBE_SECONDS at the pace: one more"
    stream_for(ADJUST_SECONDS, 6.0, streams[:2])
    pace.adjust(running=3, model_limit=12)
    assert pace.cap == 3, "the next probe waits PROBE_SECONDS again"
    stream_for(ADJUST_SECONDS, 4.0, streams[:3])  # the third stream slows them under the pace
    pace.adjust(running=3, model_limit=12)
    assert pace.cap == 2 and pace.lowered_total == 2, "a probe that slows the streams is taken back"
    pace.ended(streams[2])
    for _ in range(4):  # held at the pace again: the cap climbs one per PROBE_SECONDS
        stream_for(PROBE_SECONDS + 0.1, 6.0, streams[:2])
        pace.adjust(running=pace.cap, model_limit=12)
    assert pace.cap == 6


def test_with_one_size_seen_the_limit_steps_up_past_it_while_the_pace_holds() -> None:
    capacity = DecodeCapacity(pace_tokens_per_second=5.0, max_running=64)
    capacity.observe_batch(1, 0.1, busy_seconds=5)
    assert capacity.limit == 2
    slow = DecodeCapacity(pace_tokens_per_second=5.0, max_running=64)
    slow.observe_batch(3, 0.5, busy_seconds=5)
    assert slow.limit == 1
    assert DecodeCapacity(0, 64).limit == 64, "pace 0: admission is off"


def test_engine_windows_give_seconds_per_token_per_stream() -> None:
    load = EngineLoad(window_seconds=1.0)
    now = 0.0
    load.record(now, running=4, waiting=0, generation_tokens=0, prompt_tokens=100)
    for _ in range(25):  # 4 streams, one token each per 0.1 s step
        now += 0.1
        load.record(now, running=4, waiting=2, generation_tokens=4, prompt_tokens=0)
    windows = list(load.windows)
    assert len(windows) == 2
    assert windows[0].running == pytest.approx(4) and windows[0].waiting > 0
    assert windows[0].seconds == pytest.approx(1.1)
    assert windows[0].seconds_per_token == pytest.approx(0.1)
    capacity = DecodeCapacity(5.0, 64)
    capacity.update(load)
    assert capacity.seconds_per_token() == {4: pytest.approx(0.1)}
    assert load.generation_rate(10, now=now) == pytest.approx(40, rel=0.1)


def test_windows_spent_reading_prompts_do_not_teach_the_decode_pace() -> None:
    capacity = DecodeCapacity(5.0, 64)
    capacity.observe_batch(4, 0.1, busy_seconds=5)
    # A document part's 512-token prefill step: 3 s for one token per stream.
    prefill = LoadWindow(ended_at=1.0, seconds=3.0, busy_seconds=3.0, running=4, waiting=0,
                         generation_tokens=4, prompt_tokens=512)  # fmt: skip
    capacity.observe(prefill)
    assert capacity.seconds_per_token() == {4: pytest.approx(0.1)}
    decode = LoadWindow(ended_at=2.0, seconds=1.0, busy_seconds=1.0, running=4, waiting=0,
                        generation_tokens=20, prompt_tokens=12)  # fmt: skip
    capacity.observe(decode)
    assert capacity.seconds_per_token()[4] > 0.1, "a decode window with a short prompt still counts"


# --- per-user limits ----------------------------------------------------------------------------
def test_concurrent_turns_are_limited_across_tabs() -> None:
    limits = UserLimits(settings(user_max_concurrent_turns=2))
    usage = limits.usage("address:10.0.0.1")
    usage.turns = 2
    with pytest.raises(Refused, match="limit is 2 at a time") as refused:
        limits.check(usage)
    assert refused.value.reason == "user_concurrent_turns"
    limits.check(limits.usage("address:10.0.0.2")), "another person is not affected"


def test_tokens_per_minute_refuse_with_the_time_to_retry() -> None:
    clock = FakeClock()
    limits = UserLimits(settings(user_tokens_per_minute=100), clock)
    usage = limits.usage("u")
    limits.record_tokens(usage, 60)
    clock.now += 20
    limits.record_tokens(usage, 50)
    with pytest.raises(Refused, match="try again in ~") as refused:
        limits.check(usage)
    assert refused.value.reason == "user_tokens_per_minute"
    assert refused.value.retry_after_seconds == pytest.approx(41, abs=1.5), "when the first 60 age out"
    clock.now += 42
    limits.check(usage)


def test_documents_per_hour_refuse_with_the_time_to_retry() -> None:
    clock = FakeClock()
    limits = UserLimits(settings(user_documents_per_hour=2), clock)
    usage = limits.usage("u")
    limits.check(usage, documents=2)
    limits.record_documents(usage, 2)
    clock.now += 600
    with pytest.raises(Refused, match="limit is 2 per hour") as refused:
        limits.check(usage, documents=1)
    assert refused.value.retry_after_seconds == pytest.approx(3000)
    assert "50 min" in str(refused.value)
    limits.check(usage), "chat without a document is still fine"
    with pytest.raises(Refused, match="at most 2"):
        limits.check(limits.usage("v"), documents=3)


def test_messages_per_minute_refuse_with_the_time_to_retry_and_stay_bounded() -> None:
    clock = FakeClock()
    limits = UserLimits(settings(user_messages_per_minute=3), clock)
    usage = limits.usage("u")
    for _ in range(3):
        limits.count_message(usage)
        clock.now += 10
    for _ in range(100):  # refused messages are not counted: the wait does not grow
        with pytest.raises(Refused, match="limit is 3 per minute") as refused:
            limits.count_message(usage)
    assert refused.value.reason == "user_messages_per_minute" and len(usage.messages) == 3
    assert refused.value.retry_after_seconds == pytest.approx(30), "when the first one ages out"
    limits.count_message(limits.usage("v")), "another person is not affected"
    clock.now += 31
    limits.count_message(usage)
    unlimited = UserLimits(settings(user_messages_per_minute=0), clock)
    for _ in range(1000):
        unlimited.count_message(unlimited.usage("u"))
    assert len(unlimited.usage("u").messages) == 0


def test_no_limits_when_set_to_zero_and_records_stay_bounded() -> None:
    limits = UserLimits(
        settings(user_max_concurrent_turns=0, user_tokens_per_minute=0, user_documents_per_hour=0)
    )
    usage = limits.usage("u")
    usage.turns = 99
    for _ in range(1000):
        limits.record_tokens(usage, 1000)
        limits.record_documents(usage, 1)
    limits.check(usage, documents=50)
    assert len(usage.tokens) <= 61 and len(usage.documents) == 0


# --- feedback -------------------------------------------------------------------------------


@aio
async def test_a_waiting_turn_is_told_its_place_then_the_status_goes_away() -> None:
    clock = FakeClock()
    queue = Queue(line_with(1, clock), clock)
    await queue.submit("running", CHAT)
    await queue.submit("ahead", CHAT)
    turn = TurnContext("u", None, started_at=clock.now)
    await queue.submit("mine", CHAT, owner=turn)
    text = status_text(queue.line, turn, clock.now)
    assert text is not None and "1 request ahead of yours" in text and "to wait" in text
    shown: list[str | None] = []

    async def show(value: str | None) -> None:
        shown.append(value)

    feedback = WaitingFeedback(queue.line, turn, show)
    feedback.start()
    await settle()
    await queue.finish("running")
    assert "you are next in line" in (status_text(queue.line, turn, clock.now) or "")
    await feedback.stop()
    assert shown[0] == text and shown[-1] is None, "shown while waiting, removed at the answer"
    await queue.finish("ahead", "mine")


@aio
async def test_an_answer_that_has_not_started_is_announced_when_the_quiet_time_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On the line's clock, which only the feedback's own sleeps move here: on a real one a busy machine
    wakes a sleeper late, which is not what this checks."""
    clock = FakeClock()

    async def sleep(seconds: float) -> None:
        clock.now += seconds
        await asyncio.sleep(0)

    timed = types.SimpleNamespace(sleep=sleep, create_task=asyncio.create_task, gather=asyncio.gather)
    monkeypatch.setattr(feedback_module, "asyncio", timed)
    line = WaitingLine(settings(), FixedCapacity(1), clock)
    turn = TurnContext("u", None, started_at=clock.now)  # admitted, no token yet
    shown: list[tuple[float, str | None]] = []

    async def show(value: str | None) -> None:
        shown.append((clock.now - turn.started_at, value))

    feedback = WaitingFeedback(line, turn, show)
    feedback.start()
    await until(lambda: shown, "a status")
    await feedback.stop()
    after, text = shown[0]
    assert text is not None and "Working on your answer" in text
    assert after == QUIET_SECONDS, "at the end of the quiet time, not at the next whole interval"


# --- the whole path on a fake engine ---------------------------------------------------------------
@aio
async def test_admitted_engine_queues_streams_and_accounts_tokens_to_the_user() -> None:
    admission = Admission(
        settings(user_tokens_per_minute=1000, admission_max_wait_seconds=1000), EngineLoad(), max_running=64
    )
    admission.capacity = admission.line.capacity = FixedCapacity(1)
    engine = admission.engine(WordEngine(max_model_len=1000), CHAT)  # type: ignore[arg-type]
    sampling = SamplingSettings(0.0, 1.0, 20)

    async def turn(user: str) -> str:
        async with admission.turn(user):
            return "".join([d async for d in engine.generate([], sampling, "r")])

    first = asyncio.create_task(turn("alice"))
    await until(lambda: admission.line.engine_running == 1, "alice is admitted")
    second = asyncio.create_task(turn("bob"))
    await until(lambda: admission.line.waiting, "bob waits while alice streams")  # her 20 words: 0.2 s
    assert not first.done() and len(admission.line.waiting) == 1
    assert admission.overloaded
    a, b = await asyncio.gather(first, second)
    assert a == b == "word " * 20
    assert admission.limits.usage("alice").tokens_since(0) == 20
    assert admission.limits.usage("alice").turns == 0
    assert admission.status()["admitted_total"] == 2


@aio
async def test_steps_while_a_document_part_reads_its_prompt_are_not_learned_as_decode() -> None:
    """vLLM counts a prompt's tokens in the step that ends its prefill: the chunk steps before it look
    like slow decode with no prompt read. Learned, they held the limit at 1-2 for minutes while the
    streams got 6-11 tokens/s; the line's own record of who reads a prompt keeps them out."""
    admission = Admission(settings(), EngineLoad(), max_running=64)
    admission.learn_from_warm_up({1: 0.05, 2: 0.055, 4: 0.065, 8: 0.085})
    limit = admission.capacity.limit

    def steps(start: float) -> None:
        """Ten seconds from `start`: two requests run, a token each every 0.2 s (about four times the
        warm-up's step), no prompt token counted."""
        for tenth in range(100):
            admission.load.record(start + tenth / 10, 2, 0, 2 * (tenth % 2), 0)

    start = time.monotonic()  # after the warm-up's windows
    async with admission.line.place(DOCUMENT) as part:
        assert admission.line.reading_document
        steps(start)
        admission.refresh(now=start + 10)
        assert admission.capacity.slowdown == 1.0 and admission.capacity.limit == limit
        admission.line.note_token(part)  # its first token: the prompt is read
        assert not admission.line.reading_document
        steps(start + 10)
        admission.refresh(now=start + 20)
        assert admission.capacity.slowdown > 3 and admission.capacity.limit < limit, "decode steps count"


class QueueOverflowError(Exception):
    """Named as vllm.exceptions' (matched by name, as the app does: importing vLLM takes seconds)."""


@aio
async def test_vllms_own_queue_limit_becomes_a_busy_message_counted_in_metrics() -> None:
    admission = Admission(settings(), EngineLoad(), max_running=64)
    admission.capacity = admission.line.capacity = FixedCapacity(4)
    full = WordEngine(max_model_len=1000, fails_with=QueueOverflowError)  # vLLM's own queue refuses
    engine = admission.engine(full, CHAT)  # type: ignore[arg-type]
    with pytest.raises(Refused, match="The service is busy") as refused:
        async with admission.turn("u"):
            [d async for d in engine.generate([], SamplingSettings(0.0, 1.0, 8), "r")]
    assert refused.value.reason == "engine_queue_full"
    assert admission.status()["refusals_total"] == {"engine_queue_full": 1}
    assert admission.line.engine_running == 0 and admission.overloaded


# --- one line for chat and the API -------------------------------------------------------------------
def shared_admission(limit: int, **changes) -> Admission:
    changes.setdefault("admission_max_wait_seconds", 1000)  # these tests queue requests on purpose
    admission = Admission(settings(**changes), EngineLoad(), max_running=64)
    admission.capacity = admission.line.capacity = FixedCapacity(limit)
    admission.line.max_prefilling = 0  # no tokens stream here
    return admission


class Requests:
    """Chat turns and API requests of named people through `Admission.admit`, each holding its slot
    until `finish`; records the order of admission and each slot's vLLM priority."""

    def __init__(self, admission: Admission) -> None:
        self.admission = admission
        self.admitted: list[str] = []
        self.priorities: dict[str, int] = {}
        self.done: dict[str, asyncio.Event] = {}
        self.tasks: dict[str, asyncio.Task] = {}

    async def chat(self, person: str) -> None:
        """A chat turn: the handler opens the person's turn; the engine request is admitted in it."""
        async with self.admission.turn(user_key(person)):
            await self._hold(person, CHAT, None)

    async def api(self, person: str) -> None:
        """An API request: a turn of its own for the key's owner."""
        await self._hold(person, API, user_key(person))

    async def _hold(self, name: str, work: str, person: str | None) -> None:
        done = self.done[name] = asyncio.Event()
        async with self.admission.admit(work, person) as slot:
            self.admitted.append(name)
            self.priorities[name] = slot.priority
            await done.wait()

    async def start(self, name: str, request: Callable[[str], Awaitable[None]]) -> None:
        self.tasks[name] = asyncio.create_task(request(name))
        await asyncio.sleep(0.01)  # arrivals a few milliseconds apart

    async def finish(self, name: str) -> None:
        self.done[name].set()
        await self.tasks[name]
        await settle()


@aio
@pytest.mark.parametrize("priority", [True, False])
async def test_api_requests_and_chat_turns_compete_for_the_same_slots_in_the_rules_order(
    priority: bool,
) -> None:
    admission = shared_admission(1, api_aging_seconds=30, priority_scheduling=priority)
    requests = Requests(admission)
    await requests.start("carol", requests.chat)  # holds the only slot
    await requests.start("alice", requests.api)
    await requests.start("bob", requests.chat)  # arrives after alice's API request
    assert requests.admitted == ["carol"] and len(admission.line.waiting) == 2
    assert admission.limits.usage(user_key("alice")).turns == 1, "a waiting API request is its owner's turn"
    await requests.finish("carol")
    await requests.finish(requests.admitted[1])
    await requests.finish(requests.admitted[2])
    if priority:  # the API request ranks API_AGING_SECONDS later: the later chat turn goes first
        assert requests.admitted == ["carol", "bob", "alice"]
        assert requests.priorities["carol"] <= requests.priorities["bob"] < requests.priorities["alice"]
        assert requests.priorities["alice"] >= 30
    else:  # first come, first served, all at vLLM's default priority
        assert requests.admitted == ["carol", "alice", "bob"]
        assert set(requests.priorities.values()) == {0}
    status = admission.status()
    assert status["admitted_total"] == 3 and status["running"] == {"chat": 0}, "API requests hold chat slots"
    assert admission.limits.usage(user_key("alice")).turns == 0


@aio
async def test_a_persons_chat_and_api_requests_share_one_turn_limit_and_token_budget() -> None:
    admission = shared_admission(4, user_max_concurrent_turns=1, user_tokens_per_minute=1000)
    requests = Requests(admission)
    await requests.start("alice", requests.chat)
    with pytest.raises(Refused) as refused:
        async with admission.admit(API, user_key("alice")):
            pass
    assert refused.value.reason == "user_concurrent_turns", "her chat turn counts against her API key"
    async with admission.admit(API, user_key("bob")) as slot:  # another person is not affected
        slot.charge(7)
    await requests.finish("alice")
    async with admission.admit(API, user_key("alice")) as slot:
        slot.charge(5)
    assert admission.limits.usage(user_key("alice")).tokens_since(0) == 5
    assert admission.limits.usage(user_key("bob")).tokens_since(0) == 7
    assert admission.line.engine_running == 0 and not admission.overloaded, "no refusal for capacity"


@aio
async def test_a_message_resent_before_the_time_a_refusal_gave_gets_that_answer_without_new_work() -> None:
    admission = shared_admission(1, admission_queue_max=0)  # the running turn fills the service
    requests = Requests(admission)
    await requests.start("alice", requests.chat)
    clock = FakeClock()
    admission.limits.clock = clock
    with pytest.raises(Refused) as full:
        async with admission.turn(user_key("bob")), admission.admit(CHAT):
            pass
    assert full.value.reason == "queue_full" and full.value.retry_after_seconds > 5
    turns_before = admission.line.admitted_total
    for _ in range(20):  # a storm of resends: each told at once, nothing counted, nothing queued
        with pytest.raises(Refused, match="not sent") as early:
            await admission.message(user_key("bob"))
        assert early.value.reason == "resent_early"
    assert early.value.retry_after_seconds == pytest.approx(full.value.retry_after_seconds)
    assert admission.line.refusals["resent_early"] == 20 and admission.line.admitted_total == turns_before
    assert not admission.limits.usage(user_key("bob")).messages, "not counted against the message rate"
    await admission.message(user_key("carol"))  # someone else is not paced
    clock.now += full.value.retry_after_seconds
    await admission.message(user_key("bob"))  # at the time given: a message like any other
    admission.limits.told(admission.limits.usage(user_key("bob")), full.value)
    await requests.finish("alice")
    admission.line.others = OtherReplicas(waiting=[0.0])  # still full: someone waits on another replica
    with pytest.raises(Refused, match="not sent"):
        await admission.message(user_key("bob"))
    admission.line.others = OtherReplicas()
    await admission.message(user_key("bob"))  # the service has room again: no need to wait for the time


def test_a_refusal_of_a_persons_own_share_does_not_pace_their_messages() -> None:
    clock = FakeClock()
    limits = UserLimits(settings(), clock)
    usage = limits.usage("u")
    limits.told(usage, Refused("user_documents_per_hour", "an hour of documents", 3000))
    limits.count_message(usage)  # a question without a document is still welcome


@aio
async def test_a_cancelled_request_gives_back_its_place_its_slot_and_its_turn() -> None:
    admission = shared_admission(1)
    requests = Requests(admission)
    await requests.start("carol", requests.chat)
    await requests.start("alice", requests.api)  # waits
    await requests.start("bob", requests.chat)  # waits
    requests.tasks["alice"].cancel()
    requests.tasks["bob"].cancel()
    await settle()
    assert not admission.line.waiting and admission.limits.usage(user_key("alice")).turns == 0
    await requests.start("dave", requests.api)
    await requests.finish("carol")
    assert requests.admitted == ["carol", "dave"]
    requests.tasks["dave"].cancel()  # cancelled while it runs
    await settle()
    assert admission.line.engine_running == 0, "the slot came back"
    assert all(admission.limits.usage(user_key(p)).turns == 0 for p in ("alice", "bob", "carol", "dave"))


def test_one_key_per_person_for_chat_and_api() -> None:
    assert user_key("alice") == "user:alice", "a signed-in user's chat and API keys share it"
    assert user_key(None, "10.0.0.1") == "address:10.0.0.1" and user_key(None) == "address:unknown"


# --- prefix affinity (ENGINE_URLS) -------------------------------------------------------------------
def test_a_conversation_goes_to_the_server_holding_its_prefix_unless_it_is_overloaded() -> None:
    a, b = Server("http://a"), Server("http://b")
    history = list(range(300))
    a.prefixes.add(prefix_hashes(history))
    follow_up = prefix_hashes([*history, 7, 8, 9, *range(1000, 1100)])
    assert servers_to_try([b, a], follow_up, affinity_slack=4)[0] is a
    a.in_flight.update({"1", "2", "3"})
    assert servers_to_try([b, a], follow_up, affinity_slack=4)[0] is a, "busier, but within the slack"
    a.in_flight.update({"4", "5"})
    assert servers_to_try([b, a], follow_up, affinity_slack=4)[0] is b, "overloaded: by load"
    assert servers_to_try([b, a], follow_up, affinity_slack=None)[0] is b, "affinity off: by load"
    a.healthy = False
    a.in_flight.clear()
    assert servers_to_try([a, b], follow_up, affinity_slack=4)[0] is b, "an unhealthy holder is passed over"


def test_prefix_index_is_bounded() -> None:
    server = Server("http://a")
    server.prefixes.max_blocks = 100
    for start in range(0, 100_000, 640):
        server.prefixes.add(prefix_hashes(list(range(start, start + 640))))
    assert len(server.prefixes) == 100


# --- health for load balancers ----------------------------------------------------------------------
def test_the_docker_healthcheck_asks_healthz() -> None:
    dockerfile = (Path(__file__).resolve().parents[2] / "Dockerfile").read_text()
    check = dockerfile[dockerfile.index("HEALTHCHECK") :].split("CMD ", 1)[1].splitlines()[0]
    assert "/healthz" in check and "/status" not in check


@aio
async def test_others_requests_at_the_engine_hold_slots_and_lengthen_the_estimate() -> None:
    clock = FakeClock()
    queue = Queue(line_with(3, clock), clock)
    queue.line.foreign = 2  # another replica runs two turns on the same engine
    await queue.submit("mine-1", CHAT)
    await queue.submit("mine-2", CHAT)
    assert queue.admitted == ["mine-1"] and queue.line.engine_running == 3, "one slot was left"
    alone = line_with(3, clock)
    assert queue.line.estimate_seconds(0) > 0 and alone.estimate_seconds(0) == 0
    queue.line.foreign = 0  # the other replica's turns ended: the next refresh admits
    queue.line.admit_waiting()
    await settle()
    assert queue.admitted == ["mine-1", "mine-2"]
    await queue.finish("mine-1", "mine-2")


def test_the_engine_load_counts_others_requests_while_fresh() -> None:
    load = EngineLoad()
    load.note_foreign(100.0, engine_total=7, ours=3)
    assert load.foreign_requests(101.0, max_age=5.0) == 4
    assert load.foreign_requests(106.0, max_age=5.0) == 0, "a stale reading counts as none"
    load.note_foreign(107.0, engine_total=2, ours=3)  # ours counted after the servers answered
    assert load.foreign_requests(107.0, max_age=5.0) == 0


@aio
async def test_turns_waiting_in_other_replicas_lines_go_first_and_count_in_places() -> None:
    clock = FakeClock()
    queue = Queue(line_with(2, clock), clock)
    line = queue.line
    line.others = OtherReplicas(waiting=[clock.now - line.epoch])  # waits on another replica since now
    await queue.submit("mine-1", CHAT)  # one slot for the other's turn, one for this
    await queue.submit("mine-2", CHAT)
    assert queue.admitted == ["mine-1"], "the other replica's turn came first: its slot is kept"
    assert line.overloaded, "someone waits, if on another replica"
    ahead, estimate = line.place_of(None)
    assert ahead == 1 and estimate > 0, "the person is told of the turn waiting elsewhere"
    alone = line_with(2, clock)
    assert line.estimate_seconds(0) > alone.estimate_seconds(0)
    line.others, line.foreign = OtherReplicas(), 1  # the other replica started it: it runs at the engine
    line.admit_waiting()
    await settle()
    assert queue.admitted == ["mine-1"], "it holds its slot at the engine now"
    line.foreign = 0
    line.admit_waiting()
    await settle()
    assert queue.admitted == ["mine-1", "mine-2"]
    line.others = OtherReplicas(waiting=[clock.now + 5 - line.epoch])  # arrived elsewhere after this one
    await queue.finish("mine-1")
    await queue.submit("mine-3", CHAT, after_seconds=0)
    assert queue.admitted[2:] == ["mine-3"], "a later arrival elsewhere waits behind this replica's"
    await queue.finish("mine-2", "mine-3")


@aio
async def test_admission_queue_max_counts_the_turns_waiting_in_other_replicas_lines() -> None:
    clock = FakeClock()
    queue = Queue(line_with(1, clock, admission_queue_max=3), clock)
    line = queue.line
    await queue.submit("running", CHAT)
    line.others = OtherReplicas(waiting=[1.0, 2.0])
    await queue.submit("waits", CHAT)  # 1 here + 2 elsewhere: the line is full now
    with pytest.raises(Refused) as refused:
        async with line.place(CHAT):
            pass
    assert refused.value.reason == "queue_full" and line.waiting_by_kind[CHAT] == 1
    await queue.finish("running", "waits")


class Recorded:
    """Accounting and shared limits that record what was asked of them (the database's work)."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def check(self, user_key: str) -> None:
        self.calls.append("budget checked")

    async def open_turn(self, user_key: str, documents: int = 0) -> None:
        self.calls.append("turn opened")

    def close_turn(self, lease: object) -> None:
        self.calls.append("turn closed")

    def refused(self, user_key: str, refusal: Refused) -> None:
        self.calls.append(f"refused: {refusal.reason}")

    def started(self, user_key: str, api: bool, documents: int) -> None:
        self.calls.append("started")


@aio
async def test_a_chat_turn_the_full_line_refuses_is_told_before_any_database_work() -> None:
    admission = shared_admission(1, admission_queue_max=0)
    recorded = Recorded()
    admission.accounting = admission.shared = recorded  # type: ignore[assignment]
    requests = Requests(admission)
    await requests.start("alice", requests.chat)  # fills the service
    recorded.calls.clear()
    with pytest.raises(Refused) as full:
        async with admission.turn(user_key("bob")):
            pass
    assert full.value.reason == "queue_full" and admission.line.refusals["queue_full"] == 1
    assert recorded.calls == ["refused: queue_full"], "no budget read, no shared turn opened"
    assert admission.limits.usage(user_key("bob")).told_until, "a resend before the time is paced"
    recorded.calls.clear()
    async with admission.turn(user_key("bob"), documents=1):  # document parts wait: not refused here
        pass
    assert recorded.calls[:2] == ["budget checked", "turn opened"]
    await requests.finish("alice")
    recorded.calls.clear()
    async with admission.turn(user_key("bob")):  # room again
        pass
    assert recorded.calls == ["budget checked", "turn opened", "started", "turn closed"]


@aio
async def test_a_pace_cap_bounds_this_replicas_requests_not_the_others() -> None:
    """A replica whose streams were slow capped itself at one stream while the other replica ran
    four at the engine: counted against everyone's requests the cap left it nothing to run, so no
    stream to measure and raise it by (the replica admitted 8 turns in ten minutes)."""
    clock = FakeClock()
    queue = Queue(line_with(13, clock), clock)
    line = queue.line
    line.pace.cap, line.foreign = 1, 4
    assert line.limit == 5, "its one stream on top of the others' four"
    await queue.submit("mine-1", CHAT)
    await queue.submit("mine-2", CHAT)
    assert queue.admitted == ["mine-1"], "the cap holds for its own requests"
    line.foreign = 13
    assert line.limit == 13, "the engine's limit still bounds everyone"
    await queue.finish("mine-1")
    assert queue.admitted == ["mine-1"], "13 others, none of its own: the engine is full, not the cap"
    line.foreign = 4
    line.admit_waiting()
    await settle()
    assert queue.admitted == ["mine-1", "mine-2"]
    await queue.finish("mine-2")
