"""Password guessing against the real sign-in: guesses sent all at once are counted before any
password is checked, someone guessing from one address cannot lock an account (the admin) out for
everyone else, a script guessing many accounts from one address (an office's NAT) slows its
neighbours there but locks none of them out, and a browser that signed in before gets in whatever
others guess. Each attack comes from addresses of its own (X-Forwarded-For, trusted from
loopback), so it locks out nobody else in the suite."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import httpx
import pytest

from harness.chat_client import COOKIE_NAME, new_address
from harness.server import AppServer
from services.config import Settings
from tests.system.security.conftest import ADMIN, accounts

in_loop = pytest.mark.asyncio(loop_scope="package")

DEFAULTS = Settings.from_env({})  # the target runs the default limits
DEVICE_COOKIE = "vc_device"


async def sign_in_from(http: httpx.AsyncClient, address: str, username: str, password: str) -> httpx.Response:
    """POST /login as the page does, from `address`."""
    return await http.post(
        "/login", data={"username": username, "password": password}, headers={"X-Forwarded-For": address}
    )


async def sign_in_as(
    server: AppServer, address: str, username: str, password: str, device: str | None = None
) -> httpx.Response:
    """POST /login from `address` in a browser of its own (with its device cookie, if given)."""
    headers = {"X-Forwarded-For": address, **({"Cookie": f"{DEVICE_COOKIE}={device}"} if device else {})}
    async with httpx.AsyncClient(base_url=server.base_url, timeout=120) as browser:
        return await browser.post(
            "/login", data={"username": username, "password": password}, headers=headers
        )


async def stuffing(server: AppServer, address: str, tries: int) -> list[int]:
    """A script trying `tries` made-up accounts from `address` at once (credential stuffing)."""
    script = uuid.uuid4().hex[:8]
    tried = [sign_in_as(server, address, f"nobody-{script}-{n}", "a-leaked-password") for n in range(tries)]
    return [response.status_code for response in await asyncio.gather(*tried)]


def new_account(server: AppServer) -> tuple[str, str]:
    name, password = f"victim-{uuid.uuid4().hex[:8]}", "the-right-password"
    accounts(Path(server.env["DATA_DIR"]), "add", name, stdin=password + "\n")
    return name, password


@in_loop
async def test_guesses_sent_at_once_are_counted_before_any_password_is_checked(target: AppServer) -> None:
    name, password = new_account(target)
    attacker = new_address()
    limit = DEFAULTS.sign_in_max_failures
    async with httpx.AsyncClient(base_url=target.base_url, timeout=120) as http:
        guesses = [sign_in_from(http, attacker, name, f"wrong-guess-{n}") for n in range(24)]
        responses = await asyncio.gather(*guesses, sign_in_from(http, attacker, name, password))
    statuses = [r.status_code for r in responses]
    checked = statuses.count(401) + statuses.count(200)
    assert checked <= limit, f"{checked} passwords checked against a limit of {limit}: {statuses}"
    assert statuses.count(429) == len(statuses) - checked, statuses
    if statuses[-1] == 200:  # the right one got in only as one of the first `limit` tries
        assert statuses.count(401) < limit, statuses
    assert all(int(r.headers["retry-after"]) > 0 for r in responses if r.status_code == 429)


@in_loop
async def test_guessing_from_one_address_does_not_lock_the_admin_out_elsewhere(target: AppServer) -> None:
    attacker = new_address()
    async with httpx.AsyncClient(base_url=target.base_url, timeout=120) as http:
        guesses = await asyncio.gather(
            *(sign_in_from(http, attacker, ADMIN[0], f"guess-{n}") for n in range(30))
        )
        assert {r.status_code for r in guesses} == {401, 429}
        assert (await sign_in_from(http, attacker, *ADMIN)).status_code == 429, "the attacker waits"
        admin = await sign_in_from(http, new_address(), *ADMIN)
        assert admin.status_code == 200, f"the admin was locked out: {admin.status_code} {admin.text}"
        assert admin.cookies.get(COOKIE_NAME)


@in_loop
async def test_the_sign_in_cookie_is_http_only_same_site_and_lives_at_most_the_lifetime(
    target: AppServer,
) -> None:
    async with httpx.AsyncClient(base_url=target.base_url, timeout=60) as http:
        response = await sign_in_from(http, new_address(), *ADMIN)
    assert response.status_code == 200
    cookie = next(v for k, v in response.headers.multi_items() if k == "set-cookie" and COOKIE_NAME in v)
    attributes = {part.split("=")[0].strip().lower(): part for part in cookie.split(";")[1:]}
    assert "httponly" in attributes, cookie
    assert attributes["samesite"].split("=")[1].strip().lower() in ("lax", "strict"), cookie
    max_age = int(attributes["max-age"].split("=")[1])
    assert max_age <= 12 * 3600, f"OWASP ASVS level 2: at most 12 hours, not {max_age / 3600:g}"
    assert max_age == int(DEFAULTS.sign_in_lifetime_seconds), cookie


@in_loop
async def test_a_script_at_an_office_address_slows_its_neighbours_but_locks_none_out(
    target: AppServer,
) -> None:
    office = new_address()  # everyone behind one NAT address
    name, password = new_account(target)
    slowed_after = DEFAULTS.sign_in_max_failures_per_address
    assert await stuffing(target, office, slowed_after) == [401] * slowed_after
    burst = await stuffing(target, office, 4)
    assert burst.count(401) <= 1 and burst.count(429) >= 3, f"slowed: one try per delay at most, {burst}"
    colleague = await sign_in_as(target, office, name, password)
    if colleague.status_code == 429:  # the office's delay: seconds, not the lockout
        wait = int(colleague.headers["retry-after"])
        assert wait <= 4 * DEFAULTS.sign_in_address_delay_seconds, f"locked out for {wait} s"
        await asyncio.sleep(wait)
        colleague = await sign_in_as(target, office, name, password)
    assert colleague.status_code == 200, (
        f"a colleague was locked out: {colleague.status_code} {colleague.text}"
    )


@in_loop
async def test_a_browser_that_signed_in_before_gets_in_whatever_others_guess(target: AppServer) -> None:
    office = new_address()
    name, password = new_account(target)
    first = await sign_in_as(target, office, name, password)
    assert first.status_code == 200
    cookie = next(v for k, v in first.headers.multi_items() if k == "set-cookie" and DEVICE_COOKIE in v)
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie, cookie
    device = first.cookies[DEVICE_COOKIE]
    await stuffing(target, office, 30)  # a script at the office's address
    guesses = [
        sign_in_as(target, new_address(), name, f"guess-{n}")
        for n in range(DEFAULTS.sign_in_max_failures_per_account)
    ]
    assert 429 not in [r.status_code for r in await asyncio.gather(*guesses)]  # and guessers everywhere
    assert (await sign_in_as(target, new_address(), name, password)).status_code == 429, "the account waits"
    assert (await sign_in_as(target, office, name, password)).status_code == 429, "so does a new browser"
    laptop = await sign_in_as(target, office, name, password, device)
    assert laptop.status_code == 200, f"the person's own browser was locked out: {laptop.text}"
    assert (await sign_in_as(target, office, name, "wrong", device)).status_code == 401, "still checked"
