"""Client-chosen ids never become paths: a session id that is not a UUID is refused at the socket
and on every HTTP route, so no folder outside Chainlit's upload folder is written or deleted."""

from __future__ import annotations

import contextlib
import uuid
from pathlib import Path

import pytest
import socketio

from harness.chat_client import ChatClient
from harness.server import AppServer
from tests.system.security.conftest import ALICE

in_loop = pytest.mark.asyncio(loop_scope="package")

# An absolute path (the folder Chainlit would delete) and a relative climb to it.
HOSTILE_SESSION_IDS = ("{victim}", "../../../../{victim_name}")


def victim_folder(tmp_path: Path) -> Path:
    """A folder with a file in it, that no request of a client may touch."""
    folder = tmp_path / "victim"
    folder.mkdir()
    (folder / "precious.db").write_text("keep me")
    return folder


async def attack_with_session_id(server: AppServer, session_id: str) -> bool:
    """Connect as Alice with `session_id`, then ask Chainlit to clear the session (which deletes its
    folder) and upload into it; True when the socket was accepted."""
    client = ChatClient(server.base_url, *ALICE, session_id=session_id)
    try:
        await client.connect()
    except socketio.exceptions.ConnectionError:
        accepted = False
    else:
        accepted = True
        with contextlib.suppress(Exception):
            await client.upload("dropped.txt", b"written by an attacker", "text/plain")
        await client.close()
    return accepted


@in_loop
@pytest.mark.parametrize("template", HOSTILE_SESSION_IDS)
async def test_a_session_id_that_is_a_path_is_refused_and_nothing_is_deleted(
    target: AppServer, tmp_path: Path, template: str
) -> None:
    """The real socket refuses a session id that is a path, and the folder it names is left whole.
    Every hostile id (these two, "{victim}/x", "..", "not-a-uuid", 5,000 characters) is a unit test:
    tests/unit/security/test_handshake.py::test_a_session_id_that_is_a_path_is_refused."""
    victim = victim_folder(tmp_path)
    session_id = template.format(victim=victim, victim_name=victim.relative_to(victim.anchor))
    accepted = await attack_with_session_id(target, session_id)
    # Refused at connect, no session was made: nothing can delete the folder later, so no wait.
    assert not accepted, f"a socket with session id {session_id[:80]!r} was accepted"
    assert (victim / "precious.db").read_text() == "keep me"
    assert sorted(p.name for p in victim.iterdir()) == ["precious.db"]


@in_loop
async def test_http_routes_refuse_a_session_id_that_is_not_a_uuid(target: AppServer, tmp_path: Path) -> None:
    victim = victim_folder(tmp_path)
    alice = ChatClient(target.base_url, *ALICE)
    await alice.connect()
    try:
        upload = await alice.http(
            "POST", "/project/file", params={"session_id": f"{victim}/x"},
            files={"file": ("a.txt", b"attack", "text/plain")},
        )  # fmt: skip
        download = await alice.http("GET", f"/project/file/{uuid.uuid4()}", params={"session_id": "/"})
        custom = {"type": "custom", "id": "e", "name": "n", "display": "inline"}
        element = await alice.http("PUT", "/project/element", json={"sessionId": "..", "element": custom})
        action = await alice.http(
            "POST", "/project/action", json={"sessionId": str(victim), "action": {"name": "x", "payload": {}}}
        )
        cookie = await alice.http("POST", "/set-session-cookie", json={"session_id": "x\r\nSet-Cookie: a=b"})
        for response in (upload, download, element, action, cookie):
            assert response.status_code == 400, (response.request.url, response.status_code, response.text)
        assert sorted(p.name for p in victim.iterdir()) == ["precious.db"]
        # The page's own requests, with its UUID, still work.
        assert await alice.upload("notes.txt", b"a real upload", "text/plain")
    finally:
        await alice.close()
