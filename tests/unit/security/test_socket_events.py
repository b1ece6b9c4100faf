"""Socket events and frames the page never sends are dropped, the page's own pass: the rules alone,
without a server (on a real server: tests/system/security/test_malformed_input.py).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from chainlit.config import config as chainlit_config
from chainlit.server import sio

from harness.chat_client import user_message_payload
from services.web.socket_events import (
    SWITCHED_OFF,
    asked_while_off,
    event_problem,
    frame_problem,
    guard_socket_events,
)
from tests.system.security.fuzzing import MALFORMED_EVENTS


@pytest.mark.parametrize(
    ("name", "args"), MALFORMED_EVENTS, ids=[f"{n}-{i}" for i, (n, _) in enumerate(MALFORMED_EVENTS)]
)
def test_events_the_page_never_sends_are_dropped(name: str, args: tuple[Any, ...]) -> None:
    assert event_problem(name, args) is not None


def test_the_pages_own_events_pass() -> None:
    message = user_message_payload("Hi.", file_ids=[str(uuid.uuid4())])
    settings = {"temperature": 0.5, "system_prompt": "Be brief."}
    for name, args in [("client_message", (message,)), ("stop", ()), ("clear_session", ()),
                       ("connection_successful", ()), ("window_message", ("ping",)),
                       ("chat_settings_change", (settings,))]:  # fmt: skip
        assert event_problem(name, args) is None, name


def test_frames_python_socketio_cannot_decode_are_refused() -> None:
    for frame in ("2[", "4", "9", b"\x00\x01", "2" + "[" * 5_000):
        assert frame_problem("not-connected", frame) is not None, frame


def test_fetch_favorites_the_page_asks_on_every_load_is_dropped_without_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Chainlit's page sends `fetch_favorites` on every connect, favorites on or not (they are off
    here); Chainlit's handler then answers nothing, and so does the edge: no warning per page load."""
    monkeypatch.setattr(chainlit_config.features, "favorites", False)
    assert event_problem("fetch_favorites", ()) is not None, "never handed to Chainlit while off"
    assert asked_while_off("fetch_favorites", ())
    assert not asked_while_off("fetch_favorites", ({"x": 1},)), "not the page's shape: a warning"
    assert not asked_while_off("message_favorite", ({"message": {}},)), "the page asks it only when on"
    handle_event = fresh_guard(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="services.web.socket_events"):
        asyncio.run(handle_event("eio-sid", "/", None, ["fetch_favorites"]))
        assert not caplog.records
        asyncio.run(handle_event("eio-sid", "/", None, ["fetch_favorites", {"x": 1}]))
    assert [r.getMessage() for r in caplog.records] == [
        "socket event 'fetch_favorites' dropped: " + SWITCHED_OFF
    ]


def fresh_guard(monkeypatch: pytest.MonkeyPatch) -> Callable[..., Awaitable[None]]:
    """The edge's event handler, installed on Chainlit's socket server for this test only."""
    dispatched: list[Any] = []

    async def dispatch(*args: Any) -> None:
        dispatched.append(args)

    monkeypatch.setattr(sio, "_handle_event", dispatch)
    monkeypatch.setattr(sio.eio, "on", lambda *args: None)
    guard_socket_events()
    return sio._handle_event
