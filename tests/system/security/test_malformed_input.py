"""What the fuzz tests found, each pinned by a plain test: input Chainlit 2.12 or python-socketio did
not expect may not move another person's message, leave sessions behind, or end in a 500 or a
traceback. The fuzz tests (test_fuzz_*.py) look for more of the same; these say what was fixed."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import httpx
import pytest

from harness.chat_client import ChatClient, handshake, user_message_payload
from harness.server import AppServer
from tests.system.helpers import stored_thread
from tests.system.security.conftest import BobsConversation, Intact
from tests.system.security.fuzzing import MALFORMED_EVENTS, deep_json

in_loop = pytest.mark.asyncio(loop_scope="package")


async def signed_in_page(server: AppServer, cookie: str) -> ChatClient:
    page = ChatClient(server.base_url, cookie=cookie)
    await page.connect()
    return page


@in_loop
async def test_a_message_cannot_take_the_id_of_someone_elses_message(
    target: AppServer, alice_cookie: str, bob: BobsConversation, intact: Intact
) -> None:
    """Chainlit stores a user message under the id the browser chose, with `ON CONFLICT (id) DO
    UPDATE`: Alice sending Bob's message id moved his message into her conversation."""
    alice = await signed_in_page(target, alice_cookie)
    mark = intact.mark()
    for bobs_step in bob.step_ids:
        taken = user_message_payload("Mine now.")
        taken["message"]["id"] = bobs_step
        await alice.sio.emit("client_message", taken)
    assert (await alice.ask("And this one?")).final is not None
    # The steps are written in tasks of their own: wait for the last one she sent, after the others.
    # Once in several runs her page never got the conversation's id (Chainlit's first_interaction);
    # then a second, as before: a late write can only weaken the check below, not fail it.
    if alice.thread_id:
        await stored_thread(alice, alice.thread_id, steps=1, containing="And this one?")
    else:
        await asyncio.sleep(1)
    await alice.close()
    assert not bob.changes()
    assert not intact.problems(mark)


@in_loop
async def test_malformed_socket_traffic_is_dropped_without_a_traceback_or_a_session(
    target: AppServer, alice_cookie: str, intact: Intact
) -> None:
    """Each of these logged a traceback (or, for `connect` events and a second CONNECT packet, made
    a Chainlit session that nothing ever freed); the socket goes on working."""
    page = await signed_in_page(target, alice_cookie)
    mark = intact.mark()
    for name, args in MALFORMED_EVENTS:
        if not args:
            await page.sio.emit(name)
        else:  # a tuple is sent as several arguments
            await page.sio.emit(name, args[0] if len(args) == 1 else args)
    environ = {"HTTP_COOKIE": alice_cookie}
    await page.sio.emit("connect", (environ, handshake(str(uuid.uuid4()))))  # a forged environ, a session
    for frame in ("0" + json.dumps(handshake(str(uuid.uuid4()))), "2[", "4", '2["window_message",'
                  + deep_json(5_000) + "]", "51-[\"x\",{\"_placeholder\":true,\"num\":9}]"):  # fmt: skip
        await page.sio.eio.send(frame)
    reply = await page.ask("Still there?", timeout=60)
    assert reply.final is not None and not reply.final.startswith("⚠️"), reply.final
    await page.close()
    assert not intact.problems(mark)


@in_loop
async def test_a_lone_surrogate_in_a_message_is_answered_and_stored(
    target: AppServer, alice_cookie: str, intact: Intact
) -> None:
    """JSON may carry "\\ud800"; the tokenizer and the database take no lone surrogates: the turn
    failed with a traceback and the message was not stored."""
    page = await signed_in_page(target, alice_cookie)
    mark = intact.mark()
    reply = await page.ask("Hello \ud800 there", timeout=60)
    assert reply.final is not None and not reply.final.startswith("⚠️"), reply.final
    await page.close()
    await stored_thread(page, page.thread_id or "", steps=1, containing="Hello \ufffd there")
    assert not intact.problems(mark)


MULTIPART = "multipart/form-data; boundary=x"
BAD_REQUESTS = [
    # (method, path, JSON body or raw bytes, status): each was a 500 with a traceback
    ("PUT", "/feedback", b'{"a": "\\ud800"}', 422),  # FastAPI's 422 repeated the lone surrogate
    ("DELETE", "/project/thread", b"\xff\xfe{", 422),  # ... or bytes that are not UTF-8 (as multipart)
    ("GET", "/copilot/" + "%F0%9F%99%82" * 100, None, 404),  # a name longer than a file's
    ("GET", "/public/a%00b", None, 404),  # a NUL byte
    ("POST", "/project/action", {"sessionId": "{new_uuid}", "action": {"name": "x", "payload": {}}}, 404),
    ("PUT", "/project/element", {"sessionId": "{new_uuid}", "element": {"type": "custom"}}, 404),
    ("DELETE", "/mcp", {"sessionId": "{new_uuid}", "name": "x"}, 400),  # MCP is off
    ("PUT", "/project/element", {"sessionId": "{live}", "element": {"type": "custom", "id": [0.0]}}, 400),
    (
        "POST",
        "/project/action",
        {"sessionId": "{live}", "action": {"name": "x", "payload": {}, "zz": 1}},
        400,
    ),
]


@in_loop
@pytest.mark.parametrize(
    ("method", "path", "body", "status"), BAD_REQUESTS, ids=[f"{m} {p[:20]}" for m, p, _, _ in BAD_REQUESTS]
)
async def test_malformed_requests_get_a_client_error(
    target: AppServer, alice_cookie: str, intact: Intact, method: str, path: str, body: Any, status: int
) -> None:
    page = await signed_in_page(target, alice_cookie)
    mark = intact.mark()
    if isinstance(body, dict):
        text = json.dumps(body).replace("{new_uuid}", str(uuid.uuid4())).replace("{live}", page.session_id)
        body = text.encode()
    async with httpx.AsyncClient(base_url=target.base_url, headers={"Cookie": alice_cookie}) as http:
        kind = MULTIPART if isinstance(body, bytes) and body.startswith(b"\xff") else "application/json"
        response = await http.request(method, path, content=body, headers={"Content-Type": kind})
    await page.close()
    assert response.status_code == status, response.text
    assert not intact.problems(mark)
