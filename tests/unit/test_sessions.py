"""Session store rules (pure logic: a fake engine that counts words as tokens).

The real engine path of the same rules is covered in test_server.py.
"""

from __future__ import annotations

import asyncio

import pytest

from harness.waiting import WAIT_SECONDS, until
from services.admission.refusals import Refused
from services.chat import store as store_module
from services.chat.service import ChatService
from services.chat.store import SessionStore
from services.config import Settings
from services.engine.chat_engine import SamplingSettings
from services.engine.errors import TokenBudgetError
from tests.fakes import FakeClock, WordEngine

pytestmark = pytest.mark.asyncio(loop_scope="function")


def make_store(clock: FakeClock | None = None, **changes) -> tuple[SessionStore, ChatService, WordEngine]:
    engine = WordEngine()
    settings = Settings.from_env({}).replace(max_new_tokens=20, max_model_len=100, **changes)
    return SessionStore(settings, timer=clock or FakeClock(0.0)), ChatService(engine, settings), engine


async def run_turn(store: SessionStore, chat: ChatService, session_id: str, text: str = "hi") -> str:
    session = store.open(session_id)
    async with store.turn(session) as request_id:
        prompt = chat.build_prompt(session, text)
        return "".join([d async for d in chat.reply(session, prompt, request_id)])


async def start_turn(store: SessionStore, chat: ChatService, session_id: str) -> asyncio.Task:
    """A turn that streams until it is cancelled, returned once its first word is out."""
    session = store.open(session_id)
    session.sampling = SamplingSettings(1.0, 1.0, 10_000)
    engine = chat.engine
    earlier = len(engine.streamed)
    task = asyncio.create_task(run_turn(store, chat, session_id))
    await until(lambda: session.turn_task is task and len(engine.streamed) > earlier, "the turn streams")
    return task


async def assert_cancelled(task: asyncio.Task) -> None:
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, WAIT_SECONDS)


async def test_session_pressure_evicts_the_idle_session_never_a_running_turn() -> None:
    store, chat, engine = make_store(max_sessions=2)
    task = await start_turn(store, chat, "a")  # "a" is the least recently used, but busy
    store.open("b")
    store.open("c")  # evicts "b", the least recently used idle session
    assert store.get("b") is None and store.get("a") is not None and len(store) == 2
    assert not task.done() and not engine.aborted
    assert store.dropped_total["evicted"] == 1
    task.cancel()


async def test_session_pressure_refuses_a_new_session_when_every_one_is_busy() -> None:
    store, chat, engine = make_store(max_sessions=2)
    first, second = await start_turn(store, chat, "a"), await start_turn(store, chat, "b")
    with pytest.raises(Refused, match="all of them are answering right now") as refused:
        store.open("c")
    assert refused.value.reason == "sessions_full" and store.refused_total == 1
    assert not first.done() and not second.done() and not engine.aborted
    assert store.get("a") is not None and store.get("b") is not None
    store.get("b").cancel_turn()
    await asyncio.gather(second, return_exceptions=True)
    assert store.open("c") is store.get("c"), "an idle session makes room again"
    assert not first.done()
    first.cancel()


async def test_a_page_that_went_away_makes_room_first_and_is_dropped_after_its_window() -> None:
    clock = FakeClock(0.0)
    store, chat, engine = make_store(clock, max_sessions=3)
    store.open("idle")
    task = await start_turn(store, chat, "gone")
    store.open("newest")
    store.disconnect("gone", keep_seconds=120)  # its running turn ends now, its conversation stays
    await assert_cancelled(task)
    assert store.get("gone") is not None and store.awaiting_reconnect() == 1 and len(engine.aborted) == 1
    store.open("another")  # full: the page that went away goes before the older idle session
    assert store.get("gone") is None and store.get("idle") is not None
    store.disconnect("idle", keep_seconds=120)
    clock.now += 121
    assert store.awaiting_reconnect() == 0, "past its window it is not awaited, even before the round"
    assert store.expire() == 1 and store.get("idle") is None
    assert store.dropped_total["not_reconnected"] == 1 and store.dropped_total["evicted"] == 1


async def test_pages_awaited_are_bounded_and_the_longest_gone_are_dropped_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(store_module, "MAX_SESSIONS_AWAITING_RECONNECT", 3)
    clock = FakeClock(0.0)
    store, _, _ = make_store(clock, max_sessions=100)
    for index in range(6):
        store.open(f"tab-{index}")
    dropped = []
    for index in range(5):  # five tabs close, a second apart
        clock.now += 1
        dropped += store.disconnect(f"tab-{index}", keep_seconds=120)
    assert dropped == ["tab-0", "tab-1"], "the longest gone go first, the newest three wait"
    assert store.awaiting_reconnect() == 3 and len(store) == 4
    assert store.get("tab-5") is not None, "an open page is never dropped for the bound"
    assert store.dropped_total["reconnect_bound"] == 2
    assert store.disconnect("unknown", keep_seconds=120) == []


async def test_ttl_expiry_cancels_the_turn_and_frees_state() -> None:
    clock = FakeClock(0.0)
    store, chat, engine = make_store(clock, session_ttl_seconds=60)
    task = await start_turn(store, chat, "idle")
    clock.now += 61
    assert store.expire() == 1
    await assert_cancelled(task)
    assert len(store) == 0 and engine.aborted


async def test_activity_refreshes_the_ttl() -> None:
    clock = FakeClock(0.0)
    store, _, _ = make_store(clock, session_ttl_seconds=60)
    store.open("busy")
    clock.now += 50
    store.open("busy")
    clock.now += 50
    assert store.expire() == 0 and store.get("busy") is not None


async def test_close_cancels_the_turn() -> None:
    store, chat, engine = make_store()
    task = await start_turn(store, chat, "gone")
    store.close("gone")
    await assert_cancelled(task)
    assert store.turns_in_flight() == 0 and engine.aborted


async def test_new_turn_cancels_the_previous_one() -> None:
    store, chat, engine = make_store()
    first = await start_turn(store, chat, "s")
    store.get("s").sampling = SamplingSettings(1.0, 1.0, 3)
    answer = await run_turn(store, chat, "s", "again")
    await assert_cancelled(first)
    assert answer == "word word word "
    assert len(engine.aborted) == 1


async def test_history_is_trimmed_oldest_first_keeping_the_system_prompt() -> None:
    store, chat, _ = make_store()
    session = store.open("talk")
    for i in range(6):
        session.history.append({"role": "user", "content": f"question {i} " + "x " * 10})
        session.history.append({"role": "assistant", "content": f"answer {i} " + "y " * 10})
    prompt = chat.build_prompt(session, "newest question")
    assert prompt.messages[0]["role"] == "system"
    assert prompt.messages[-1]["content"] == "newest question"
    assert prompt.dropped_messages > 0 and prompt.dropped_messages % 2 == 0
    kept = [m["content"] for m in prompt.messages[1:-1]]
    assert kept[-1].startswith("answer 5"), "the newest turns are kept"
    assert len(chat.engine.encode_chat(prompt.messages)) + 20 <= chat.engine.max_model_len


async def test_a_message_that_cannot_fit_is_refused() -> None:
    store, chat, _ = make_store()
    with pytest.raises(TokenBudgetError):
        chat.build_prompt(store.open("s"), "word " * 200)


async def test_history_length_is_bounded() -> None:
    store, chat, _ = make_store(max_history_messages=4)
    for i in range(5):
        await run_turn(store, chat, "s", f"q{i}")
    assert len(store.get("s").history) == 4


async def test_settings_are_clamped_and_junk_ignored() -> None:
    store, _, _ = make_store(max_new_tokens_limit=100)
    session = store.open("s")
    store.update_settings(session, {"temperature": 9, "top_p": "nan?", "max_new_tokens": 10**6, "x": 1})
    assert session.sampling.temperature == 2.0
    assert session.sampling.top_p == 0.9
    assert session.sampling.max_new_tokens == 100


async def test_sessions_whose_page_is_believed_there_are_those_no_disconnect_reached() -> None:
    """What the maintenance round checks against the page's socket: sessions awaiting their page are
    not in it, and one that came back is again."""
    store, _, _ = make_store()
    for session_id in ("here", "left", "back"):
        store.open(session_id)
    store.disconnect("left", keep_seconds=120)
    store.disconnect("back", keep_seconds=120)
    store.open("back")
    assert sorted(store.believed_connected()) == ["back", "here"]
