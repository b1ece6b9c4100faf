"""LDAP sign-in on a real server (tiny model, SQLite, AUTH_MODE=ldap) against a real slapd
(tests/conftest.py `slapd`), through Chainlit's password form and socket as the page uses them.

Its own pooled server: LDAP mode replaces password sign-in, so the shared password server cannot
serve these tests. The directory's service account is configured, so signed-in people are looked
up again every SIGN_IN_CHECK_SECONDS (1 s here)."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import httpx
import pytest

from harness.chat_client import ChatClient, new_address
from harness.server import AppServer
from harness.slapd import ADMINS_GROUP, PEOPLE, READER_DN, Slapd, user_dn
from tests.conftest import LDAP_PEOPLE, LDAP_READER_PASSWORD, ServerPool, pooled
from tests.system.conftest import accounts, tiny_env

# a server of its own: per commit, test_ldap_directory.py against the same slapd
pytestmark = pytest.mark.long

in_loop = pytest.mark.asyncio(loop_scope="module")

SIGN_IN_CHECK_SECONDS = 1
MARGIN_SECONDS = 10  # on top of SIGN_IN_CHECK_SECONDS, for a busy machine
ALICE = ("alice", LDAP_PEOPLE["alice"])
BOB = ("bob", LDAP_PEOPLE["bob"])
ROOT = ("root", LDAP_PEOPLE["root"])  # in cn=admins
LOCAL_ALICE_PASSWORD = "local-alice-password-9"
PASSWORDS_USED: list[str] = [*LDAP_PEOPLE.values(), LDAP_READER_PASSWORD, LOCAL_ALICE_PASSWORD]


@pooled(group="ldap")
def ldap_server(server_pool: ServerPool, tiny_model_dir: Path, slapd: Slapd) -> AppServer:
    env = tiny_env(
        tiny_model_dir, AUTH_MODE="ldap", LDAP_URL=slapd.url,
        LDAP_USER_DN_TEMPLATE=f"uid={{username}},{PEOPLE}",
        LDAP_BIND_DN=READER_DN, LDAP_BIND_PASSWORD=LDAP_READER_PASSWORD, LDAP_ADMIN_GROUP_DN=ADMINS_GROUP,
        LDAP_TIMEOUT_SECONDS=2, SIGN_IN_CHECK_SECONDS=SIGN_IN_CHECK_SECONDS,
    )  # fmt: skip
    return server_pool.get(env, "ldap-server")


async def login(server: AppServer, username: str, password: str) -> httpx.Response:
    """The sign-in form's POST, from an address of its own (the per-address limit stays out of it)."""
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
        form = {"username": username, "password": password}
        return await http.post("/login", data=form, headers={"X-Forwarded-For": new_address()})


async def cookie_of(server: AppServer, username: str, password: str) -> str:
    response = await login(server, username, password)
    assert response.status_code == 200, (response.status_code, response.text)
    return f"access_token={response.cookies['access_token']}"


async def me(server: AppServer, cookie: str) -> httpx.Response:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
        return await http.get("/user", headers={"Cookie": cookie})


async def who(server: AppServer, cookie: str) -> tuple[str, str]:
    response = await me(server, cookie)
    assert response.status_code == 200, response.text
    return response.json()["identifier"], (response.json().get("metadata") or {}).get("role")


async def ended_within(server: AppServer, cookie: str, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while (await me(server, cookie)).status_code == 200:
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.2)
    return True


def binds_since(directory: Slapd, before: str) -> str:
    return "\n".join(line for line in directory.log()[len(before) :].splitlines() if " BIND " in line)


def new_person(directory: Slapd, admin: bool = False) -> tuple[str, str]:
    name, password = f"p{uuid.uuid4().hex[:8]}", f"pw-{uuid.uuid4().hex}"
    PASSWORDS_USED.append(password)
    directory.add_person(name, password)
    if admin:
        directory.add_to_admins(name)
    return name, password


@in_loop
async def test_the_right_password_signs_in_and_chats_as_ldap_name(ldap_server: AppServer) -> None:
    alice = ChatClient(ldap_server.base_url, "Alice", ALICE[1])
    await alice.connect()
    assert alice.cookie and await who(ldap_server, alice.cookie) == ("ldap:alice", "user")
    assert (await alice.ask("Hello there")).final
    thread_id = alice.thread_id
    bob = ChatClient(ldap_server.base_url, *BOB)
    await bob.connect()
    for _ in range(50):  # writes are async: wait until alice's conversation is stored
        if (await alice.http("GET", f"/project/thread/{thread_id}")).status_code == 200:
            break
        await asyncio.sleep(0.2)
    assert (await alice.http("GET", f"/project/thread/{thread_id}")).status_code == 200
    assert (await bob.http("GET", f"/project/thread/{thread_id}")).status_code != 200, "bob saw alice's chat"
    await alice.close()
    await bob.close()


@in_loop
async def test_a_local_account_of_the_same_name_is_not_taken_over(ldap_server: AppServer) -> None:
    """A local administrator `alice`: the directory's alice is ldap:alice, a user; the local
    password is not a directory password."""
    accounts(Path(ldap_server.env["DATA_DIR"]), "add", "alice", "--admin", stdin=LOCAL_ALICE_PASSWORD + "\n")
    cookie = await cookie_of(ldap_server, *ALICE)
    assert await who(ldap_server, cookie) == ("ldap:alice", "user")
    assert (await login(ldap_server, "alice", LOCAL_ALICE_PASSWORD)).status_code == 401
    assert (await login(ldap_server, "ldap:alice", ALICE[1])).status_code == 401  # not a directory name


@in_loop
async def test_a_wrong_password_is_refused(ldap_server: AppServer) -> None:
    assert (await login(ldap_server, "bob", "not-bobs-password")).status_code == 401
    assert (await login(ldap_server, "nobody", "anything")).status_code == 401


@in_loop
async def test_an_empty_password_is_refused_without_a_bind(ldap_server: AppServer, slapd: Slapd) -> None:
    before = slapd.log()
    response = await login(ldap_server, "bob", "")
    assert response.status_code in (401, 422), response.text  # Chainlit's form may refuse it first
    await asyncio.sleep(0.5)
    assert user_dn("bob").lower() not in binds_since(slapd, before).lower()


@in_loop
@pytest.mark.parametrize("hostile", ["*", ")(uid=*", "admin,ou=x", "bob)(|(uid=*", "bob\\2a"])
async def test_an_injection_like_name_is_refused(ldap_server: AppServer, slapd: Slapd, hostile: str) -> None:
    before = slapd.log()
    assert (await login(ldap_server, hostile, BOB[1])).status_code == 401
    await asyncio.sleep(0.3)
    assert not binds_since(slapd, before), "a hostile name reached the directory"


@in_loop
async def test_a_member_of_the_admins_group_is_an_administrator(ldap_server: AppServer) -> None:
    root = ChatClient(ldap_server.base_url, *ROOT)
    await root.connect()
    assert root.cookie and await who(ldap_server, root.cookie) == ("ldap:root", "admin")
    report = await root.ask("/stats", timeout=120)
    assert report.final and "for administrators" not in report.final
    await root.close()


@in_loop
async def test_leaving_the_group_ends_the_sign_in_and_the_next_is_a_user(
    ldap_server: AppServer, slapd: Slapd
) -> None:
    name, password = new_person(slapd, admin=True)
    cookie = await cookie_of(ldap_server, name, password)
    assert await who(ldap_server, cookie) == (f"ldap:{name}", "admin")
    slapd.remove_from_admins(name)
    assert await ended_within(ldap_server, cookie, SIGN_IN_CHECK_SECONDS + MARGIN_SECONDS)
    chat = ChatClient(ldap_server.base_url, name, password)
    await chat.connect()
    assert chat.cookie and await who(ldap_server, chat.cookie) == (f"ldap:{name}", "user")
    refused = await chat.ask("/stats")
    assert "for administrators" in (refused.final or ""), refused.final
    await chat.close()


@in_loop
async def test_removal_from_the_directory_ends_the_sign_in_and_refuses_the_next(
    ldap_server: AppServer, slapd: Slapd
) -> None:
    name, password = new_person(slapd)
    chat = ChatClient(ldap_server.base_url, name, password)
    await chat.connect()  # a tab open during the removal
    assert chat.cookie and (await chat.ask("Hi")).final
    slapd.delete_person(name)
    assert await ended_within(ldap_server, chat.cookie, SIGN_IN_CHECK_SECONDS + MARGIN_SECONDS)
    refused = await chat.ask("Still there?")
    assert "no longer in the directory" in (refused.final or ""), refused.final
    await chat.close()
    assert (await login(ldap_server, name, password)).status_code == 401


@in_loop
async def test_a_directory_that_is_down_gets_a_clear_refusal_and_the_service_stays_up(
    ldap_server: AppServer, slapd: Slapd
) -> None:
    signed_in = await cookie_of(ldap_server, *BOB)
    slapd.stop()
    try:
        refused = await login(ldap_server, *ALICE)
        assert refused.status_code == 503, refused.text
        assert "directory cannot be reached" in refused.json()["detail"]
        status, _ = ldap_server.healthz()
        assert status == 200
        await asyncio.sleep(SIGN_IN_CHECK_SECONDS + 0.5)
        assert (await me(ldap_server, signed_in)).status_code == 200, "a sign-in made before stays usable"
    finally:
        slapd.start()
    assert (await login(ldap_server, *ALICE)).status_code == 200


def test_no_password_reaches_the_server_log(ldap_server: AppServer) -> None:
    log = ldap_server.log_path.read_text(errors="replace")
    assert "LDAP sign-in of ldap:alice" in log, "the log this test reads is the server's"
    leaked = [password for password in PASSWORDS_USED if password in log]
    assert not leaked, f"passwords in {ldap_server.log_path}"
    assert "Traceback" not in log
