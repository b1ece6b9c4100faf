"""What Chainlit's page sends on every load, on the shared password server: answered as Chainlit
answers it, with no line in the server's log (the rule alone: tests/unit/security/test_socket_events.py)."""

from __future__ import annotations

import asyncio

import pytest

from harness.chat_client import PAGE_CONNECT_EVENTS, ChatClient
from harness.server import AppServer
from tests.system.conftest import ALICE

in_loop = pytest.mark.asyncio(loop_scope="module")


@in_loop
async def test_a_page_load_leaves_no_warning_about_favorites(password_server: AppServer) -> None:
    """The page asks `fetch_favorites` on every connect although favorites are off: each page load
    logged "socket event 'fetch_favorites' dropped". An event the page never sends still is."""
    assert "fetch_favorites" in PAGE_CONNECT_EVENTS
    logged_before = password_server.log_path.stat().st_size
    alice = ChatClient(password_server.base_url, *ALICE)
    await alice.connect()  # as the page connects: connection_successful, then fetch_favorites
    try:
        await alice.sio.emit("stop", {"not": "the page's"})  # "stop" takes no data: one warning
        helped = await alice.ask("", command="help", timeout=30)  # a round trip after them
        assert helped.final is not None
    finally:
        await alice.close()
    logged = await until_logged(password_server, logged_before, "socket event 'stop' dropped")
    assert "fetch_favorites" not in logged, logged[-2000:]


async def until_logged(server: AppServer, offset: int, line: str, timeout: float = 15) -> str:
    """The server's log from `offset`, once it holds `line` (events run in tasks of their own)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        with server.log_path.open("rb") as log:
            log.seek(offset)
            logged = log.read().decode(errors="replace")
        if line in logged:
            return logged
        assert asyncio.get_running_loop().time() < deadline, f"not logged: {line}\n{logged[-2000:]}"
        await asyncio.sleep(0.1)
