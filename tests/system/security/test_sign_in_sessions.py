"""Sign-ins end when they should, at every door: after a new password, a new role, the account's
removal (even when the name is given out again) and a sign-out, an old cookie is refused on the
HTTP routes, at the socket and by `POST /auth/jwt` (which would otherwise swap it for a fresh one);
a chat open at the time is refused its next message, and an answer under way when its account is
removed is not stored. The accounts command runs in its own process, like another replica: the
server reads the account at every check, so it sees the change at once."""

from __future__ import annotations

import asyncio
import sqlite3
import time
import uuid
from pathlib import Path

import httpx
import jwt
import pytest
import socketio

from harness.chat_client import COOKIE_NAME, ChatClient, sign_in
from harness.server import AppServer
from harness.waiting import until
from tests.system.security.conftest import accounts

in_loop = pytest.mark.asyncio(loop_scope="package")


def new_person(server: AppServer, role_flag: tuple[str, ...] = ()) -> tuple[str, str]:
    name, password = f"person-{uuid.uuid4().hex[:8]}", "persons-password"
    accounts(Path(server.env["DATA_DIR"]), "add", name, *role_flag, stdin=password + "\n")
    return name, password


def operator(server: AppServer, *args: str, stdin: str = "") -> None:
    accounts(Path(server.env["DATA_DIR"]), *args, stdin=stdin)


def token_of(cookie: str) -> str:
    return cookie.split("=", 1)[1]


async def request(server: AppServer, cookie: str | None, method: str, path: str, **kwargs) -> httpx.Response:
    headers = {"Cookie": cookie} if cookie else {}
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30, headers=headers) as http:
        return await http.request(method, path, **kwargs)


async def works(server: AppServer, cookie: str) -> bool:
    return (await request(server, cookie, "GET", "/user")).status_code == 200


async def socket_accepted(server: AppServer, cookie: str) -> bool:
    client = ChatClient(server.base_url, cookie=cookie)
    try:
        await client.connect()
    except socketio.exceptions.ConnectionError:
        return False
    await client.close()
    return True


async def assert_ended(server: AppServer, cookie: str, within: float = 0) -> None:
    """The cookie is refused on HTTP (within `within` seconds: by default at once, as every check
    reads the account afresh), at the socket and by /auth/jwt."""
    deadline = time.monotonic() + within
    while await works(server, cookie):
        assert time.monotonic() < deadline, f"the old cookie still works after {within} s"
        await asyncio.sleep(0.2)
    threads = await request(
        server, cookie, "POST", "/project/threads", json={"pagination": {"first": 5}, "filter": {}}
    )
    assert threads.status_code == 401, threads.text
    refreshed = await request(
        server, None, "POST", "/auth/jwt", headers={"Authorization": f"Bearer {token_of(cookie)}"}
    )
    assert refreshed.status_code == 401 and COOKIE_NAME not in refreshed.cookies, "refreshed an ended sign-in"
    assert not await socket_accepted(server, cookie), "the socket took an ended sign-in"


@in_loop
async def test_a_new_password_ends_old_sign_ins_everywhere(target: AppServer) -> None:
    name, password = new_person(target)
    chat = ChatClient(target.base_url, name, password)
    await chat.connect()  # a tab open during the change
    cookie = chat.cookie
    assert cookie and await works(target, cookie) and await socket_accepted(target, cookie)
    operator(target, "reset-password", name, stdin="a-brand-new-password\n")
    await assert_ended(target, cookie)
    refused = await chat.ask("Hello?")
    assert "sign-in has ended" in (refused.final or ""), refused.final
    await chat.close()
    fresh = await sign_in(target.base_url, name, "a-brand-new-password")
    assert fresh and await works(target, fresh) and await socket_accepted(target, fresh)


@in_loop
async def test_auth_jwt_refreshes_only_a_good_sign_in_and_keeps_its_start(target: AppServer) -> None:
    name, password = new_person(target)
    cookie = await sign_in(target.base_url, name, password)
    assert cookie
    await asyncio.sleep(1.1)  # a refreshed token issued now would carry a later start
    refreshed = await request(
        target, None, "POST", "/auth/jwt", headers={"Authorization": f"Bearer {token_of(cookie)}"}
    )
    assert refreshed.status_code == 200
    new_token = refreshed.cookies[COOKIE_NAME]
    claims = [jwt.decode(t, options={"verify_signature": False}) for t in (token_of(cookie), new_token)]
    assert claims[0]["metadata"]["session"] == claims[1]["metadata"]["session"], "the lifetime restarted"
    operator(target, "reset-password", name, stdin="another-new-password\n")
    await assert_ended(target, f"{COOKIE_NAME}={new_token}")
    await assert_ended(target, cookie)


@in_loop
async def test_a_removed_account_given_back_does_not_revive_old_cookies(target: AppServer) -> None:
    name, password = new_person(target)
    cookie = await sign_in(target.base_url, name, password)
    assert cookie
    operator(target, "remove", name)
    operator(target, "add", name, stdin=password + "\n")  # the same name, even the same password
    await assert_ended(target, cookie)
    fresh = await sign_in(target.base_url, name, password)
    assert fresh and await works(target, fresh)


@in_loop
async def test_signing_out_ends_every_sign_in_of_the_account_at_once(target: AppServer) -> None:
    name, password = new_person(target)
    laptop = await sign_in(target.base_url, name, password)
    phone = await sign_in(target.base_url, name, password)
    assert laptop and phone and await works(target, laptop) and await works(target, phone)
    out = await request(target, laptop, "POST", "/logout")
    assert out.status_code == 200 and out.cookies.get(COOKIE_NAME) in (None, ""), out.headers
    for cookie in (laptop, phone):
        assert not await works(target, cookie), "signing out must end the session at once"
        await assert_ended(target, cookie)
    again = await sign_in(target.base_url, name, password)
    assert again and await works(target, again)
    assert (await request(target, laptop, "POST", "/logout")).status_code == 200, "an ended one signs out too"
    assert await works(target, again), "a sign-out with an ended cookie ends nothing more"


@in_loop
async def test_a_new_role_ends_the_accounts_sign_ins(target: AppServer) -> None:
    name, password = new_person(target)
    cookie = await sign_in(target.base_url, name, password)
    assert cookie and await works(target, cookie)
    operator(target, "set-role", name, "admin")
    await assert_ended(target, cookie)
    admin = await sign_in(target.base_url, name, password)
    assert admin and (await request(target, admin, "GET", "/user")).json()["metadata"]["role"] == "admin"


def stored_rows(server: AppServer, thread_id: str) -> int:
    """The conversation's rows (its thread and its messages) in the server's database."""
    with sqlite3.connect(Path(server.env["DATA_DIR"]) / "chat.db") as database:
        threads = database.execute('SELECT COUNT(*) FROM threads WHERE "id" = ?', (thread_id,)).fetchone()
        steps = database.execute('SELECT COUNT(*) FROM steps WHERE "threadId" = ?', (thread_id,)).fetchone()
    return int(threads[0]) + int(steps[0])


@in_loop
async def test_an_answer_under_way_when_its_account_is_removed_is_not_stored(target: AppServer) -> None:
    name, password = new_person(target)
    chat = ChatClient(target.base_url, name, password)
    await chat.connect()
    await chat.start_long_answer()
    thread_id = await chat.conversation_id()
    await until(lambda: stored_rows(target, thread_id), "the new conversation stored", 30, interval=0.1)
    await asyncio.to_thread(operator, target, "remove", name)  # its conversations are deleted
    mark = target.log_path.stat().st_size
    await chat.stop()  # the answer so far is written as its turn ends
    await chat.leave()  # and the tab's chat settings as it closes

    def dropped_or_stored() -> bool:
        log = target.log_path.read_bytes()[mark:].decode(errors="replace")
        return f"a write of {name}'s conversation was not stored" in log or stored_rows(target, thread_id) > 0

    await until(dropped_or_stored, "the late writes dropped (or stored)", 30, interval=0.1)
    await asyncio.sleep(1)  # the tab's last write comes after the answer's
    assert stored_rows(target, thread_id) == 0, "the late writes brought the conversation back"
