"""Who the proxy is, is decided by the TCP peer, never by X-Forwarded-For: uvicorn run with
FORWARDED_ALLOW_IPS=* (usual in containers) believes any client's X-Forwarded-For, so the app keeps
the peer uvicorn saw before rewriting and trusts only that. The forwarded address counts (for
per-address limits) only when the peer is a trusted proxy."""

from __future__ import annotations

import httpx
import pytest

from harness.chat_client import COOKIE_NAME, ChatClient
from harness.server import AppServer
from tests.system.security.conftest import PROXY_ADDRESS, PROXY_USER_HEADER

# a server of its own: per commit, tests/unit/test_sign_in_trust.py
pytestmark = pytest.mark.long

in_loop = pytest.mark.asyncio(loop_scope="package")

UNTRUSTED_ADDRESS = "127.0.0.3"  # a client of its own on this machine, not a proxy the app trusts
MAX_FAILURES_PER_ADDRESS = 20  # SIGN_IN_MAX_FAILURES_PER_ADDRESS's default, as `target` runs


async def from_address(
    server: AppServer, address: str, method: str, path: str, **kw: object
) -> httpx.Response:
    """One request whose TCP connection comes from `address` (any 127.x address is this machine)."""
    transport = httpx.AsyncHTTPTransport(local_address=address)
    async with httpx.AsyncClient(base_url=server.base_url, transport=transport, timeout=60) as http:
        return await http.request(method, path, **kw)  # type: ignore[arg-type]


@in_loop
async def test_a_client_that_names_the_proxy_in_x_forwarded_for_is_not_the_proxy(
    proxied_target: AppServer,
) -> None:
    headers = {"X-Forwarded-For": PROXY_ADDRESS, PROXY_USER_HEADER: "admin"}
    response = await from_address(proxied_target, "127.0.0.1", "POST", "/auth/header", headers=headers)
    assert response.status_code == 401, (response.status_code, response.text)
    assert COOKIE_NAME not in response.cookies


@in_loop
async def test_the_proxy_signs_people_in_whatever_client_it_names(proxied_target: AppServer) -> None:
    """The real proxy adds the client's address, as every proxy does: it is still the proxy."""
    headers = {"X-Forwarded-For": "203.0.113.9", PROXY_USER_HEADER: "Grace"}
    response = await from_address(proxied_target, PROXY_ADDRESS, "POST", "/auth/header", headers=headers)
    assert response.status_code == 200 and COOKIE_NAME in response.cookies, (
        response.status_code,
        response.text,
    )
    grace = ChatClient(proxied_target.base_url, cookie=f"{COOKIE_NAME}={response.cookies[COOKIE_NAME]}")
    await grace.connect()
    try:
        assert (await grace.ask("Hello?")).final is not None
    finally:
        await grace.close()


@in_loop
async def test_a_new_x_forwarded_for_per_attempt_does_not_escape_the_per_address_limit(
    target: AppServer,
) -> None:
    """Password guessing from one untrusted client, a new claimed address and a new name each time."""
    statuses = []
    for attempt in range(MAX_FAILURES_PER_ADDRESS + 1):
        response = await from_address(
            target, UNTRUSTED_ADDRESS, "POST", "/login",
            data={"username": f"nobody{attempt}", "password": "guess-guess-guess"},
            headers={"X-Forwarded-For": f"198.51.100.{attempt + 1}"},
        )  # fmt: skip
        statuses.append(response.status_code)
    assert statuses[:MAX_FAILURES_PER_ADDRESS] == [401] * MAX_FAILURES_PER_ADDRESS, statuses
    assert statuses[-1] == 429, statuses
