"""/admin is the administrators' alone, and a page elsewhere cannot make an administrator act:
a signed-in person gets 403 on every /admin path and method, nobody signed in is sent to /login (GET)
or gets 401; an administrator's POST without this sign-in's CSRF token, with another sign-in's token,
from another Origin or without one is refused and changes nothing; forms are bounded, and what people
chose (their names) is shown escaped."""

from __future__ import annotations

import asyncio
import re
import uuid
from pathlib import Path

import httpx
import pytest

from harness.chat_client import sign_in
from harness.server import AppServer
from tests.system.security.conftest import ADMIN, Intact, accounts

in_loop = pytest.mark.asyncio(loop_scope="package")

CSRF = re.compile(r'name="csrf" value="([^"]+)"')
PAGES = [
    "/admin", "/admin/", "/admin/accounts", "/admin/keys", "/admin/live", "/admin/audit", "/admin/audit.csv",
    "/admin/usage", "/admin/usage.csv", "/admin/admin.css", "/admin/nothing/here", "/admin/accounts/add",
    "/admin/../admin/accounts",
]  # fmt: skip
ACTIONS = [
    "/admin/accounts/add", "/admin/accounts/remove", "/admin/accounts/set-role",
    "/admin/accounts/reset-password", "/admin/keys/revoke", "/admin/usage/set-quota",
    "/admin/usage/clear-quota", "/admin", "/admin/unknown/action",
]  # fmt: skip
FORM = "application/x-www-form-urlencoded"


def person(target: AppServer) -> str:
    name = f"victim-{uuid.uuid4().hex[:8]}"
    accounts(Path(target.env["DATA_DIR"]), "add", name, stdin="victims-password-1\n")
    return name


def role_of(target: AppServer, name: str) -> str | None:
    listed = accounts(Path(target.env["DATA_DIR"]), "list").stdout.splitlines()
    return next((line.split()[1] for line in listed if line.split()[0] == name), None)


async def admin_page(target: AppServer) -> tuple[httpx.AsyncClient, str]:
    cookie = await sign_in(target.base_url, *ADMIN)
    http = httpx.AsyncClient(base_url=target.base_url, headers={"Cookie": cookie or ""}, timeout=30)
    page = await http.get("/admin/accounts")
    assert page.status_code == 200, page.text
    return http, CSRF.search(page.text)[1]  # type: ignore[index]


@in_loop
async def test_a_person_who_is_not_an_administrator_gets_403_everywhere(
    target: AppServer, alice_cookie: str, intact: Intact
) -> None:
    mark = intact.mark()
    origin = {"Origin": target.base_url}
    async with httpx.AsyncClient(base_url=target.base_url, headers={"Cookie": alice_cookie}) as alice:
        for path in PAGES:
            for method in ("GET", "HEAD", "PUT", "DELETE"):
                answer = await alice.request(method, path, headers=origin)
                assert answer.status_code == 403, (method, path, answer.status_code)
        for path in ACTIONS:
            fields = {
                "username": "alice",
                "role": "admin",
                "csrf": "x",
                "confirm": "yes",
                "prefix": "sk-vc-AAAAAA",
            }
            answer = await alice.post(path, data=fields, headers=origin)
            assert answer.status_code == 403 and "csrf" not in answer.text, (path, answer.text)
    assert role_of(target, "alice") == "user"
    assert intact.problems(mark, sessions=False) == []


@in_loop
async def test_nobody_signed_in_is_sent_to_sign_in_and_sees_nothing(target: AppServer) -> None:
    async with httpx.AsyncClient(base_url=target.base_url) as anonymous:
        for path in PAGES:
            answer = await anonymous.get(path)
            assert answer.status_code == 303 and answer.headers["location"] == "/login", (
                path,
                answer.status_code,
            )
        for path in ACTIONS:
            answer = await anonymous.post(path, data={"username": "x"}, headers={"Origin": target.base_url})
            assert answer.status_code == 401, (path, answer.status_code)
        forged = await anonymous.get("/admin", headers={"Cookie": "access_token=eyJhbGciOiJub25lIn0.e30."})
        assert forged.status_code == 303


@in_loop
async def test_a_post_needs_this_sign_ins_token_and_the_apps_origin(
    target: AppServer, intact: Intact
) -> None:
    mark = intact.mark()
    victim = person(target)
    http, token = await admin_page(target)
    # The same administrator, signed in elsewhere: a second later (a sign-in within the same second
    # is the same signed cookie, times are whole seconds, so the same sign-in).
    await asyncio.sleep(1.1)
    _, other_token = await admin_page(target)
    assert other_token != token
    change = {"username": victim, "role": "admin"}
    own = {"Origin": target.base_url}
    try:
        for fields, headers, why in (
            (change, own, "no token"),
            ({**change, "csrf": ""}, own, "empty token"),
            ({**change, "csrf": token[:-2] + "AA"}, own, "wrong token"),
            ({**change, "csrf": other_token}, own, "another sign-in's token"),
            ({**change, "csrf": token}, {"Origin": "https://evil.example"}, "another site"),
            ({**change, "csrf": token}, {"Origin": "null"}, "an opaque origin"),
            ({**change, "csrf": token}, {}, "no Origin"),
        ):
            answer = await http.post("/admin/accounts/set-role", data=fields, headers=headers)
            assert answer.status_code == 403, (why, answer.status_code, answer.text)
        assert role_of(target, victim) == "user", "a refused POST changed the account"
        as_json = await http.post("/admin/accounts/set-role", json={**change, "csrf": token}, headers=own)
        assert as_json.status_code == 400
        repeated = f"username={victim}&role=admin&role=user&csrf={token}"
        twice = await http.post(
            "/admin/accounts/set-role", content=repeated, headers={**own, "Content-Type": FORM}
        )
        assert twice.status_code == 400
        padded = {**change, "csrf": token, "pad": "x" * 2_000_000}
        huge = await http.post("/admin/accounts/set-role", data=padded, headers=own)
        assert huge.status_code == 413
        assert role_of(target, victim) == "user"
        done = await http.post("/admin/accounts/set-role", data={**change, "csrf": token}, headers=own)
        assert done.status_code == 200 and role_of(target, victim) == "admin"
    finally:
        await http.aclose()
    assert intact.problems(mark, sessions=False) == []


@in_loop
async def test_names_people_chose_are_shown_escaped(target: AppServer) -> None:
    hostile = f"<img/src=x/onerror=alert({uuid.uuid4().hex[:6]})>"
    accounts(Path(target.env["DATA_DIR"]), "add", hostile, stdin="hostile-password-1\n")
    http, _ = await admin_page(target)
    try:
        for path in ("/admin/accounts", "/admin/audit?action=account.added"):
            page = await http.get(path)
            assert hostile.lower() not in page.text and "&lt;img/src=x/onerror=alert(" in page.text, path
            assert "content-security-policy" in page.headers and page.headers["cache-control"] == "no-store"
            assert "<script" not in page.text
    finally:
        await http.aclose()
