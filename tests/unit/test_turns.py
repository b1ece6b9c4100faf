"""A chat page's events in order (services/chat/turns.py), over a fake page and a fake engine: what the
page shows, what the history keeps, and that Stop ends the engine request."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from harness.waiting import until
from services.admission.service import Admission
from services.chat.service import ChatService
from services.chat.store import SessionStore
from services.chat.turns import ChatTurns, NothingKept
from services.config import Settings
from services.engine.load import EngineLoad
from tests.fakes import FakePage, WordEngine

pytestmark = pytest.mark.asyncio(loop_scope="function")


def make_turns(**changes: Any) -> tuple[ChatTurns, WordEngine]:
    engine = WordEngine()
    settings = Settings.from_env({}).replace(**{"max_new_tokens": 20, "max_model_len": 100, **changes})
    admission = Admission(settings, EngineLoad(), max_running=64)
    chat = ChatService(engine, settings)  # type: ignore[arg-type]
    return ChatTurns(SessionStore(settings), admission, chat, NothingKept()), engine


async def test_a_message_streams_its_answer_into_one_reply_and_joins_the_history() -> None:
    turns, _ = make_turns(max_new_tokens=3)
    page = FakePage()
    await turns.answer(page, "hello there", [])
    (reply,) = page.replies
    assert reply.content == "word word word " and reply.sent == 1 and reply.metadata == {"answer": True}
    session = turns.sessions.get(page.session_id)
    assert session is not None and [m["role"] for m in session.history] == ["user", "assistant"]
    assert page.forgotten == 1, "Chainlit's copy of the messages is dropped after every turn"


async def test_stop_cancels_the_running_turn_and_aborts_its_engine_request() -> None:
    turns, engine = make_turns()
    page = FakePage()
    answering = asyncio.create_task(turns.answer(page, "hello", []))
    await until(lambda: engine.streamed, "the answer streams")
    turns.stop(page.session_id)
    with pytest.raises(asyncio.CancelledError):
        await answering
    assert len(engine.aborted) == 1
    assert page.forgotten == 1


async def test_a_refused_turn_says_when_to_retry_in_its_reply() -> None:
    turns, engine = make_turns(user_max_concurrent_turns=1)
    page = FakePage()
    first = asyncio.create_task(turns.answer(page, "hello", []))
    await until(lambda: engine.streamed, "the first turn streams")
    other = FakePage()
    other.session_id = "tab-2"
    await turns.answer(other, "hello too", [])
    (reply,) = other.replies
    assert reply.content.startswith("⏳") and reply.metadata["refused"], reply.content
    first.cancel()
    await asyncio.gather(first, return_exceptions=True)


async def test_start_sends_the_settings_panel_and_end_keeps_the_conversation_for_a_reconnect() -> None:
    turns, _ = make_turns()
    page = FakePage()
    await turns.start(page)
    assert page.shown == [("settings", turns.sessions.settings.max_new_tokens_limit)]
    turns.end(page.session_id, cleared=False, keep_seconds=60)
    assert len(turns.sessions) == 1 and turns.sessions.awaiting_reconnect() == 1
    turns.end(page.session_id, cleared=True, keep_seconds=60)
    assert len(turns.sessions) == 0
