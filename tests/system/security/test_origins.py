"""Another site's page must not use the app with its visitor's cookie: a socket opened from a foreign
origin is refused, and a cross-origin request gets no CORS permission to read what it asked for."""

from __future__ import annotations

import uuid

import aiohttp
import httpx
import pytest
import socketio

from harness.chat_client import COOKIE_NAME, SOCKET_PATH, handshake, sign_in
from harness.server import AppServer
from tests.system.security.conftest import ALICE

in_loop = pytest.mark.asyncio(loop_scope="package")

FOREIGN_ORIGINS = ("https://evil.example", "http://127.0.0.1.evil.example", "null", "http://localhost:1")


async def socket_accepted(server: AppServer, cookie: str | None, origin: str | None) -> bool:
    """Open the chat socket as a browser on `origin` would (None: a client that sends no Origin)."""
    headers = {**({"Cookie": cookie} if cookie else {}), **({"Origin": origin} if origin else {})}
    async with aiohttp.ClientSession() as session:  # closed here also when the socket is refused
        client = socketio.AsyncClient(reconnection=False, http_session=session)
        try:
            await client.connect(
                server.base_url, socketio_path=SOCKET_PATH, transports=["websocket"],
                auth=handshake(str(uuid.uuid4())), headers=headers, wait_timeout=10,
            )  # fmt: skip
        except socketio.exceptions.ConnectionError:
            return False
        await client.disconnect()
        return True


@in_loop
async def test_a_socket_from_a_foreign_origin_is_refused(target: AppServer) -> None:
    cookie = await sign_in(target.base_url, *ALICE)
    for origin in FOREIGN_ORIGINS:
        assert not await socket_accepted(target, cookie, origin), f"a socket from {origin} was accepted"
    # The app's own page (on any of its loopback names) and clients that send no Origin still connect.
    port = target.port
    for origin in (target.base_url, f"http://localhost:{port}", f"http://[::1]:{port}", None):
        assert await socket_accepted(target, cookie, origin), f"the socket from {origin} was refused"


@in_loop
async def test_socket_polling_from_a_foreign_origin_is_refused(target: AppServer) -> None:
    cookie = await sign_in(target.base_url, *ALICE)
    async with httpx.AsyncClient(base_url=target.base_url, headers={"Cookie": cookie or ""}) as http:
        foreign = await http.get(SOCKET_PATH + "/", params={"EIO": "4", "transport": "polling"},
                                 headers={"Origin": "https://evil.example"})  # fmt: skip
        own = await http.get(SOCKET_PATH + "/", params={"EIO": "4", "transport": "polling"},
                             headers={"Origin": target.base_url})  # fmt: skip
        unnamed = await http.get(SOCKET_PATH + "/", params={"EIO": "4", "transport": "polling"})
    assert foreign.status_code == 400, foreign.text
    assert "access-control-allow-origin" not in foreign.headers
    for response in (own, unnamed):  # the page's first request names no Origin (same origin, GET)
        assert response.status_code == 200 and response.text.startswith("0{"), response.text


@in_loop
async def test_cross_origin_requests_get_no_cors_permission(target: AppServer) -> None:
    cookie = await sign_in(target.base_url, *ALICE)
    evil = "https://evil.example"
    async with httpx.AsyncClient(base_url=target.base_url, headers={"Cookie": cookie or ""}) as http:
        preflight = await http.options("/project/threads", headers={
            "Origin": evil, "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type",
        })  # fmt: skip
        read = await http.get("/user", headers={"Origin": evil})
        own = await http.options("/project/threads", headers={
            "Origin": target.base_url, "Access-Control-Request-Method": "POST",
        })  # fmt: skip
    assert "access-control-allow-origin" not in preflight.headers, preflight.headers
    assert preflight.status_code == 400, preflight.text
    assert read.status_code == 200 and "access-control-allow-origin" not in read.headers, read.headers
    assert own.headers.get("access-control-allow-origin") == target.base_url


@in_loop
async def test_a_sign_in_form_posted_from_another_site_is_refused(target: AppServer) -> None:
    """Login CSRF: another site's page auto-submits the attacker's name and password to /login, which
    would sign its visitor's browser in as the attacker. Every other write route gets the same rule
    (tests/unit/security/test_same_origin_writes.py walks Chainlit's route table)."""
    form = {"username": ALICE[0], "password": ALICE[1]}
    async with httpx.AsyncClient(base_url=target.base_url, timeout=30) as http:
        foreign = await http.post("/login", data=form, headers={"Origin": "https://evil.example"})
        unnamed = await http.post("/login", data=form, headers={"Sec-Fetch-Site": "cross-site"})
        own = await http.post("/login", data=form, headers={"Origin": target.base_url})
    for refused in (foreign, unnamed):
        assert refused.status_code == 403, (refused.status_code, refused.text)
        assert "set-cookie" not in refused.headers and COOKIE_NAME not in refused.cookies
    assert own.status_code == 200 and COOKIE_NAME in own.cookies, (own.status_code, own.text)
