"""Local mode (nothing configured, bound to loopback) makes a browser on this machine the local
administrator without a login form. It must be that browser: a page under another name that
resolves to 127.0.0.1 (DNS rebinding), a reverse proxy or tunnel into loopback, or another site's
page is refused on every route and on the socket. The install's token (DATA_DIR/local-token, printed
at start) signs in anything else on purpose."""

from __future__ import annotations

import uuid
from pathlib import Path

import httpx
import pytest
import socketio
from playwright.sync_api import sync_playwright

from harness.browser import ANSWER, CHROMIUM, CHROMIUM_ARGS, send_message, wait_for_session
from harness.chat_client import COOKIE_NAME, SOCKET_PATH, ChatClient, handshake, sign_in
from harness.server import AppServer

in_loop = pytest.mark.asyncio(loop_scope="package")

REBIND_HOST = "rebind.attacker.example"  # the attacker's name, resolving to 127.0.0.1
TUNNEL_HOST = "workstation.example"  # this machine's name as a tunnel or proxy passes it on


def host(server: AppServer, name: str) -> str:
    return f"{name}:{server.port}"


async def request(server: AppServer, method: str, path: str, headers: dict[str, str], **kw) -> httpx.Response:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
        return await http.request(method, path, headers=headers, **kw)


async def socket_accepted(server: AppServer, headers: dict[str, str]) -> bool:
    """Whether the socket opens with these headers (a fresh dict: python-socketio pops the cookie)."""
    sio = socketio.AsyncClient(reconnection=False)
    try:
        await sio.connect(server.base_url, socketio_path=SOCKET_PATH, transports=["websocket"],
                          auth=handshake(str(uuid.uuid4())),
                          headers=dict(headers), wait_timeout=10)  # fmt: skip
    except socketio.exceptions.ConnectionError:
        return False
    await sio.disconnect()
    return True


def local_token(server: AppServer) -> str:
    return (Path(server.env["DATA_DIR"]) / "local-token").read_text().strip()


@in_loop
async def test_a_page_under_another_name_is_not_signed_in(local_target: AppServer) -> None:
    """DNS rebinding: the attacker's page, now served from 127.0.0.1, posts to /auth/header."""
    rebound = host(local_target, REBIND_HOST)
    response = await request(
        local_target, "POST", "/auth/header", {"Host": rebound, "Origin": f"http://{rebound}"}
    )
    assert response.status_code in (401, 403), (response.status_code, response.text)
    assert COOKIE_NAME not in response.cookies


@in_loop
@pytest.mark.parametrize(("name", "value"), [("X-Forwarded-For", "203.0.113.9"), ("Via", "1.1 edge-proxy")])
async def test_a_request_that_came_through_a_proxy_is_not_signed_in(
    local_target: AppServer, name: str, value: str
) -> None:
    """The real sign-in route refuses a request that names a proxy. Every proxy header (these two,
    CF-Connecting-IP, True-Client-IP, X-Forwarded-Host, X-Forwarded-Proto, Forwarded, X-Real-IP) is
    a unit test: tests/unit/test_sign_in_trust.py::test_a_proxied_request_is_not_signed_in_locally."""
    response = await request(local_target, "POST", "/auth/header", {name: value})
    assert response.status_code in (401, 403), (name, response.status_code)
    assert COOKIE_NAME not in response.cookies


@in_loop
async def test_a_proxy_that_rewrites_the_host_is_told_by_the_browsers_origin(local_target: AppServer) -> None:
    """nginx's default `proxy_pass http://127.0.0.1:PORT`: the Host is loopback and no forwarding
    header is added, but the remote browser's page says where it comes from."""
    response = await request(local_target, "POST", "/auth/header", {"Origin": "https://chat.public.example"})
    assert response.status_code in (401, 403), response.status_code
    assert COOKIE_NAME not in response.cookies


@in_loop
async def test_no_route_answers_a_page_under_another_name(local_target: AppServer) -> None:
    rebound = {"Host": host(local_target, REBIND_HOST)}
    for path in ("/", "/auth/config", "/status", "/metrics", "/healthz", "/user", "/project/settings"):
        response = await request(local_target, "GET", path, rebound)
        assert response.status_code == 403, (path, response.status_code, response.text[:200])
    assert not await socket_accepted(local_target, rebound)


@in_loop
async def test_another_sites_page_cannot_open_the_local_socket(local_target: AppServer) -> None:
    """Even with the local browser's cookie (a browser that sends it along), a page of another site
    cannot talk to the local chat."""
    cookie = await sign_in(local_target.base_url)
    assert cookie
    headers = {"Cookie": cookie, "Origin": "http://evil.example"}
    assert not await socket_accepted(local_target, headers)
    response = await request(local_target, "GET", "/user", headers)
    assert response.status_code == 403, response.status_code
    assert await socket_accepted(local_target, {"Cookie": cookie, "Origin": local_target.base_url})


@in_loop
async def test_the_install_token_signs_in_under_another_name(local_target: AppServer) -> None:
    tunnel = {"Host": host(local_target, TUNNEL_HOST)}
    wrong = await request(local_target, "GET", "/auth/local", tunnel, params={"token": "guessed"})
    assert wrong.status_code == 403 and COOKIE_NAME not in wrong.cookies
    right = await request(
        local_target, "GET", "/auth/local", tunnel, params={"token": local_token(local_target)}
    )
    assert right.status_code in (302, 303) and COOKIE_NAME in right.cookies, right.status_code
    cookie = {**tunnel, "Cookie": f"{COOKIE_NAME}={right.cookies[COOKIE_NAME]}"}
    me = await request(local_target, "GET", "/user", cookie)
    assert me.status_code == 200 and me.json()["identifier"] == "local"
    assert (await request(local_target, "GET", "/", cookie)).status_code == 200
    assert await socket_accepted(local_target, cookie)
    log = local_target.log_path.read_text(errors="replace")
    assert f"/auth/local?token={local_token(local_target)}" in log, "the token's URL is printed at start"


@in_loop
async def test_the_local_browser_still_signs_in_without_a_token(local_target: AppServer) -> None:
    for name in ("localhost", "127.0.0.1", "[::1]"):
        named = host(local_target, name)
        response = await request(
            local_target, "POST", "/auth/header", {"Host": named, "Origin": f"http://{named}"}
        )
        assert response.status_code == 200 and COOKIE_NAME in response.cookies, (name, response.status_code)
    client = ChatClient(local_target.base_url)  # as the tests and load generators connect
    await client.connect()
    try:
        assert (await client.ask("Hello?")).final is not None
    finally:
        await client.close()


@pytest.mark.browser
def test_a_real_browser_under_another_name_gets_nothing_but_chats_with_the_token(
    local_target: AppServer,
) -> None:
    """Chromium, with both names resolving to 127.0.0.1 as the attacker's DNS (or a tunnel) would."""
    rules = f"--host-resolver-rules=MAP {REBIND_HOST} 127.0.0.1, MAP {TUNNEL_HOST} 127.0.0.1"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=[*CHROMIUM_ARGS, rules])
        try:
            page = browser.new_page()
            rebound = page.goto(f"http://{host(local_target, REBIND_HOST)}/")
            assert rebound is not None and rebound.status == 403
            posted = page.evaluate("fetch('/auth/header', {method: 'POST'}).then(r => r.status)")
            assert posted == 403, "the rebinding page's own sign-in request"
            page.goto(
                f"http://{host(local_target, TUNNEL_HOST)}/auth/local?token={local_token(local_target)}"
            )
            wait_for_session(page)
            send_message(page, "Hello from the tunnel.")
            page.locator(ANSWER).first.wait_for(timeout=60_000)
        finally:
            browser.close()
