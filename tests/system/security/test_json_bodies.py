"""A JSON body nested deeper than any real request is refused with 400, on the API (in OpenAI's error
shape) and on Chainlit's routes, instead of a RecursionError (500 and a traceback in the log)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from harness.chat_client import ChatClient
from harness.server import AppServer
from tests.system.security.conftest import ALICE, accounts

in_loop = pytest.mark.asyncio(loop_scope="package")

DEEP = b"[" * 100_000 + b"]" * 100_000  # past Python's recursion limit
DEEPER_THAN_ALLOWED = b'{"a":' * 200 + b"1" + b"}" * 200  # parses, but no real request nests so deep
CHAINLIT_JSON_ROUTES = (
    ("POST", "/auth/jwt"), ("POST", "/auth/header"), ("POST", "/set-session-cookie"),
    ("PUT", "/feedback"), ("DELETE", "/feedback"), ("POST", "/project/threads"),
    ("PUT", "/project/element"), ("DELETE", "/project/element"), ("PUT", "/project/thread"),
    ("PUT", "/project/thread/share"), ("DELETE", "/project/thread"), ("POST", "/project/action"),
    ("POST", "/mcp"), ("DELETE", "/mcp"),
)  # fmt: skip


def log_since(server: AppServer, offset: int) -> str:
    return server.log_path.read_bytes()[offset:].decode(errors="replace")


@in_loop
async def test_deep_json_on_the_api_is_400_in_openais_shape(target: AppServer) -> None:
    key = accounts(Path(target.env["DATA_DIR"]), "key", "create", ALICE[0]).stdout.split()[0]
    offset = target.log_path.stat().st_size
    async with httpx.AsyncClient(base_url=target.base_url, timeout=30) as http:
        for body in (DEEP, b'{"model": "m", "messages": ' + DEEPER_THAN_ALLOWED + b"}"):
            for path in ("/v1/chat/completions", "/v1/completions"):
                response = await http.post(path, content=body, headers={
                    "Authorization": f"Bearer {key}", "Content-Type": "application/json"})  # fmt: skip
                assert response.status_code == 400, (path, response.status_code, response.text[:300])
                error = response.json()["error"]
                assert error["type"] == "invalid_request_error" and error["code"] == "invalid_json", error
                assert "nested" in error["message"], error
    log = log_since(target, offset)
    assert "RecursionError" not in log and "Traceback" not in log, log[-3000:]


@in_loop
async def test_deep_json_on_chainlit_routes_is_400(target: AppServer) -> None:
    alice = ChatClient(target.base_url, *ALICE)
    await alice.connect()
    offset = target.log_path.stat().st_size
    try:
        for body in (DEEP, DEEPER_THAN_ALLOWED):
            for method, path in CHAINLIT_JSON_ROUTES:
                for content_type in ("application/json", "text/plain", None):
                    headers = {"Content-Type": content_type} if content_type else {}
                    response = await alice.http(method, path, content=body, headers=headers)
                    assert response.status_code == 400, (method, path, content_type, response.status_code)
        # Real requests are not affected.
        listed = await alice.http("POST", "/project/threads", json={"pagination": {"first": 5}, "filter": {}})
        assert listed.status_code == 200, listed.text
    finally:
        await alice.close()
    log = log_since(target, offset)
    assert "RecursionError" not in log and "Traceback" not in log, log[-3000:]


@in_loop
async def test_a_deep_socket_message_is_dropped_without_a_traceback(target: AppServer) -> None:
    alice = ChatClient(target.base_url, *ALICE)
    await alice.connect()
    offset = target.log_path.stat().st_size
    try:
        for data in (DEEP, DEEPER_THAN_ALLOWED):  # raw socket.io EVENT packets, as no client library would
            await alice.sio.eio.send('2["client_message",' + data.decode() + "]")
        assert (await alice.ask("Still there?", timeout=60)).final is not None, "the socket still serves"
    finally:
        await alice.close()
    log = log_since(target, offset)
    assert "RecursionError" not in log and "Traceback" not in log, log[-3000:]


@in_loop
async def test_an_oversized_body_on_chainlit_routes_is_413(target: AppServer) -> None:
    alice = ChatClient(target.base_url, *ALICE)
    await alice.connect()
    try:
        padding = "x" * (2 * 1024 * 1024)  # MAX_REQUEST_BODY_BYTES is 1 MiB
        listed = await alice.http("POST", "/project/threads", json={"pagination": {"first": 5}, "filter": {},
                                                                   "padding": padding})  # fmt: skip
        assert listed.status_code == 413, (listed.status_code, listed.text[:300])
    finally:
        await alice.close()
