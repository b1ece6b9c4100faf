"""Pages that vanish, stop or finish, at once, on the shared tiny server: nothing is left behind.

The per-commit smoke of the soak (test_soak.py, long tier; bench/memory/soak.py the verdict): the
same leftovers, without the memory slopes. A page that vanished mid-answer keeps its conversation
only as a session awaiting its reconnect; its engine request, its turn and Chainlit's chat context
are gone at once.
"""

from __future__ import annotations

import asyncio

import pytest

from harness.chat_client import ChatClient
from harness.server import AppServer

pytestmark = pytest.mark.asyncio(loop_scope="module")

PAGES = 12  # a third vanish mid-answer, a third press Stop, a third read a short answer
LONG_ANSWER_TOKENS = 3000


async def one_page(server: AppServer, number: int) -> str:
    client = ChatClient(server.base_url)
    await client.connect()
    how = ("vanish", "stop", "finish")[number % 3]
    try:
        if how == "finish":
            await client.update_settings(max_new_tokens=8)
            assert (await client.ask(f"Question {number}?")).final
            return how
        await client.start_long_answer(LONG_ANSWER_TOKENS)  # returns at its first token
        if how == "vanish":
            await client.drop()
            return how
        await client.stop()
        return how
    finally:
        if how != "vanish":
            await client.close()


async def test_vanished_stopped_and_finished_pages_leave_no_request_turn_or_chat_context(
    tiny_server: AppServer,
) -> None:
    before = await tiny_server.astatus()
    ended = await asyncio.gather(*(one_page(tiny_server, number) for number in range(PAGES)))
    vanished = ended.count("vanish")
    assert vanished == PAGES // 3

    def settled(status: dict) -> bool:
        return (
            status["engine_unfinished_requests"] == 0
            and status["turns_in_flight"] == 0
            and status["sessions"] == before["sessions"] + vanished
        )

    after = await tiny_server.poll(settled, timeout=30)
    # Only the vanished pages' conversations stay, each waiting for its page to come back.
    waiting = after["sessions_awaiting_reconnect"] - before["sessions_awaiting_reconnect"]
    assert waiting == vanished, after
    assert after["chainlit_chat_contexts"] == 0, "Chainlit's own per-session dict is emptied"
