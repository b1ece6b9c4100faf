"""Socket events and frames the page never sends are dropped, the page's own pass: the rules alone,
without a server (on a real server: tests/system/security/test_malformed_input.py).
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from harness.chat_client import user_message_payload
from services.web.socket_events import event_problem, frame_problem
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
