"""The socket handshake the page sends, and what the server refuses in it, without a server (the
attacks with client-chosen ids on a real server: tests/system/security/test_client_ids.py).
"""

from __future__ import annotations

import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.chat_client import handshake
from services.web.client_ids import handshake_problem, session_folder

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


# tests/system/security/test_client_ids.py's session ids that are paths ({victim}: a folder's absolute
# path, {victim_name}: the same without its root)
HOSTILE_SESSION_IDS = {
    "absolute path": "{victim}",
    "under an absolute path": "{victim}/x",
    "relative climb": "../../../../{victim_name}",
    "parent folder": "..",
    "not a uuid": "not-a-uuid",
    "5,000 characters": "a" * 5000,
}


@pytest.mark.parametrize("template", HOSTILE_SESSION_IDS.values(), ids=HOSTILE_SESSION_IDS.keys())
def test_a_session_id_that_is_a_path_is_refused(tmp_path: Path, template: str) -> None:
    """The socket refuses the handshake the system test's client sends with it, and no session folder
    is ever made of it (Chainlit would create and later delete `FILES_DIRECTORY / session_id`)."""
    victim = tmp_path / "victim"
    session_id = template.format(victim=victim, victim_name=victim.relative_to(victim.anchor))
    assert handshake_problem(handshake(session_id)) == "the session id must be a UUID"
    with pytest.raises(PermissionError):
        session_folder(SimpleNamespace(id=session_id))  # type: ignore[arg-type]
