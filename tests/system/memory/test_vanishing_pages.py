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


FRESH_PAGES = 60  # a storm of pages that go away as they arrive: after connecting, a message or a setting
ROUND_SECONDS = 30  # the servers' maintenance round (MAINTENANCE_INTERVAL_SECONDS' default)


async def fresh_page(server: AppServer, number: int) -> None:
    """A page that connects and vanishes within 0.3 s, at once or after sending a message or a
    setting: its events and its disconnect reach the server in either order."""
    client = ChatClient(server.base_url)
    await client.connect()
    if number % 3 == 1:
        await client.send(f"Question {number}?")
    elif number % 3 == 2:
        await client.update_settings(temperature=0.5)
    await asyncio.sleep((number % 10) * 0.03)  # gone while its events are on the way, or just after
    await client.drop()


def not_awaiting(status: dict) -> int:
    """Sessions taken to have their page there (no disconnect seen for them)."""
    return status["sessions"] - status["sessions_awaiting_reconnect"]


async def test_pages_that_leave_as_they_arrive_leave_no_session_but_one_awaiting_them(
    tiny_server: AppServer,
) -> None:
    """A page gone before its chat start or its message reached the session store (Chainlit's
    disconnect ran first) must not leave a session living until the idle TTL: by the next maintenance
    round it ends, with Chainlit's copy and its turn. (Before the round's
    check of the sockets, about 20 of 60 such pages left a session nobody awaited.)"""
    before = await tiny_server.astatus()
    await asyncio.gather(*(fresh_page(tiny_server, number) for number in range(FRESH_PAGES)))

    def settled(status: dict) -> bool:
        return not_awaiting(status) <= not_awaiting(before) and status["turns_in_flight"] == 0

    await tiny_server.poll(settled, timeout=2 * ROUND_SECONDS + 15)
