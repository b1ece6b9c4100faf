"""The socket handshake the page sends, and what the server refuses in it, without a server (the
attacks with client-chosen ids on a real server: tests/system/security/test_client_ids.py).
"""

from __future__ import annotations

import uuid

import pytest

from harness.chat_client import handshake
from services.web.client_ids import handshake_problem

GOOD = handshake(str(uuid.uuid4()))  # what the page sends


@pytest.mark.parametrize(
    ("change", "refused"),
    [
        ({}, False),
        ({"threadId": str(uuid.uuid4())}, False),
        ({"sessionId": str(uuid.uuid4()).upper()}, False),
        ({"threadId": "x' OR '1'='1"}, True),
        ({"sessionId": None}, True),
        ({"sessionId": ["a"]}, True),
        ({"clientType": "slack"}, True),
        ({"chatProfile": "p" * 10_000}, True),
        ({"userEnv": {"KEY": "value"}}, True),
        ({"userEnv": '{"KEY": "value"}'}, False),
        ({"userEnv": "not json"}, True),  # Chainlit parses it unchecked: a traceback per connect
        ({"userEnv": "[1]"}, True),
    ],
)
def test_the_handshake_is_what_the_page_sends(change: dict, refused: bool) -> None:
    assert (handshake_problem({**GOOD, **change}) is not None) == refused
    assert handshake_problem("not a dict") is not None
