"""The admin page and the audit log on the shared password server (tests/system/conftest.py):
the administrator manages accounts and keys in a real Chromium, and every action, sign-in, key,
deletion and the start's settings leave an audit entry that holds no secret.

Each test makes people of its own (the server is shared with the people tests and the attack suite)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import sqlite3
import subprocess
import sys
import uuid

import httpx
import pytest
from playwright.sync_api import expect, sync_playwright

from harness.browser import browser_page, sign_in_on_page, wait_for_session
from harness.chat_client import ChatClient, SignInError, new_address, sign_in
from harness.server import ROOT, AppServer
from harness.waiting import WAIT_SECONDS, until_sync
from services.config import Settings
from tests.conftest import ARTIFACTS
from tests.system.conftest import ADMIN, ALICE, BOB, OPS_TOKEN, accounts
from tests.system.helpers import data_dir, stored_thread

SHOTS = ARTIFACTS / "screenshots"
CSRF = re.compile(r'name="csrf" value="([^"]+)"')
PAGE_TIMEOUT_MS = 90_000  # 2 cores shared with other test sessions: a page has taken over 30 s


@pytest.fixture(scope="module")
def server(password_server: AppServer) -> AppServer:
    return password_server


def audit_rows(server: AppServer) -> list[dict]:
    """Every audit entry, read straight from the server's SQLite file, oldest first."""
    with sqlite3.connect(data_dir(server) / "chat.db") as db:
        db.row_factory = sqlite3.Row
        return [dict(row) for row in db.execute("SELECT * FROM audit_log ORDER BY at")]


def new_person(server: AppServer, *flags: str) -> tuple[str, str]:
    name, password = f"adm-{uuid.uuid4().hex[:8]}", f"pw-{uuid.uuid4().hex}"
    accounts(data_dir(server), "add", name, *flags, stdin=password + "\n")
    return name, password


def created_key(server: AppServer, name: str) -> str:
    return accounts(data_dir(server), "key", "create", name).stdout.split()[0]


class AdminClient:
    """An administrator's browser, as HTTP: the cookie, the page's Origin and its CSRF token."""

    def __init__(self, server: AppServer, who: tuple[str, str] = ADMIN) -> None:
        cookie = asyncio.run(sign_in(server.base_url, *who))
        self.origin = server.base_url
        self.http = httpx.Client(base_url=server.base_url, headers={"Cookie": cookie or ""}, timeout=30)
        page = self.http.get("/admin")
        assert page.status_code == 200, page.text
        self.csrf = CSRF.search(page.text)[1]  # type: ignore[index]

    def post(self, path: str, **fields: str) -> httpx.Response:
        return self.http.post(path, data={"csrf": self.csrf, **fields}, headers={"Origin": self.origin})


@pytest.mark.browser
def test_the_administrator_manages_accounts_and_keys_in_the_browser(server: AppServer) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    name, new_password = f"web-{uuid.uuid4().hex[:8]}", f"first-{uuid.uuid4().hex[:10]}"
    blocked: list[str] = []
    with sync_playwright() as playwright:
        browser, page = browser_page(playwright, blocked)
        try:
            sign_in_on_page(page, server, ADMIN)
            wait_for_session(page)
            page.goto(server.base_url + "/admin", timeout=PAGE_TIMEOUT_MS)
            expect(page.locator("h1")).to_have_text("Accounts")
            page.screenshot(path=str(SHOTS / "admin-accounts.png"), full_page=True)
            adding = page.locator('form[action="/admin/accounts/add"]')
            adding.locator('input[name="username"]').fill(name)
            adding.locator('input[name="password"]').fill(new_password)
            adding.locator("button").click()
            expect(page.locator(".notice")).to_contain_text(f"Added {name} (user)")
            row = page.locator("tr", has=page.locator("td", has_text=re.compile(f"^{name}$")))
            row.locator('form[action="/admin/accounts/set-role"] select').select_option("admin")
            row.locator('form[action="/admin/accounts/set-role"] button').click()
            expect(page.locator(".notice")).to_contain_text(f"{name} is now admin")
            page.screenshot(path=str(SHOTS / "admin-role-changed.png"), full_page=True)
            reset = row.locator('form[action="/admin/accounts/reset-password"]')
            reset.locator('input[name="password"]').fill(new_password + "-2")
            reset.locator("button").click()
            expect(page.locator(".notice")).to_contain_text(f"New password set for {name}")
            key = created_key(server, name)
            page.goto(f"{server.base_url}/admin/keys?user={name}", timeout=PAGE_TIMEOUT_MS)
            expect(page.locator("td", has_text=key[:12])).to_be_visible()
            page.screenshot(path=str(SHOTS / "admin-keys.png"), full_page=True)
            page.locator('form[action="/admin/keys/revoke"] button').click()
            expect(page.locator(".notice")).to_contain_text(f"Revoked {key[:12]}")
            page.goto(server.base_url + "/admin/live", timeout=PAGE_TIMEOUT_MS)
            expect(page.locator("svg.plot").first).to_be_visible()
            page.screenshot(path=str(SHOTS / "admin-live.png"), full_page=True)
            page.goto(f"{server.base_url}/admin/audit?actor={ADMIN[0]}&since=1h", timeout=PAGE_TIMEOUT_MS)
            expect(page.locator("td", has_text="api_key.revoked").first).to_be_visible()
            page.screenshot(path=str(SHOTS / "admin-audit.png"), full_page=True)
            page.goto(f"{server.base_url}/admin/usage?days=7", timeout=PAGE_TIMEOUT_MS)
            expect(page.locator("h1")).to_have_text("Usage and quotas")
            page.screenshot(path=str(SHOTS / "admin-usage.png"), full_page=True)
            assert page.evaluate("window.cspViolations") == []
        finally:
            browser.close()
    assert blocked == [], f"the admin page asked for other sites: {blocked}"
    with pytest.raises(SignInError):
        asyncio.run(sign_in(server.base_url, name, new_password))  # the first password is gone
    cookie = asyncio.run(sign_in(server.base_url, name, new_password + "-2"))
    with httpx.Client(base_url=server.base_url, headers={"Cookie": cookie or ""}) as http:
        assert http.get("/admin").status_code == 200, "the new role is admin"
    listed = accounts(data_dir(server), "key", "list", name).stdout
    assert key[:12] not in listed, "the key was revoked"


def test_every_action_leaves_an_audit_entry_and_no_secret(server: AppServer) -> None:
    secrets = [ADMIN[1], ALICE[1], BOB[1], OPS_TOKEN, (data_dir(server) / "auth-secret").read_text().strip()]
    good, bad = new_address(), new_address()
    asyncio.run(_sign_ins(server, good, bad, secrets))
    person, password = new_person(server)
    key = created_key(server, person)
    accounts(data_dir(server), "key", "revoke", key[:12])
    accounts(data_dir(server), "set-role", person, "admin")
    accounts(data_dir(server), "remove", person)
    thread_id = asyncio.run(_deleted_conversation(server, secrets))
    admin = AdminClient(server)
    secrets.append(admin.http.headers["Cookie"].split("=", 1)[1])
    web_person, web_password = f"aud-{uuid.uuid4().hex[:8]}", f"w-{uuid.uuid4().hex}"
    for path, fields in (
        ("/admin/accounts/add", {"username": web_person, "role": "user", "password": web_password}
                                | {"sign_in": "password"}),
        ("/admin/accounts/set-role", {"username": web_person, "role": "admin"}),
        ("/admin/accounts/reset-password", {"username": web_person, "password": web_password + "x"}),
        ("/admin/accounts/remove", {"username": web_person, "confirm": "yes"}),
    ):  # fmt: skip
        assert admin.post(path, **fields).status_code == 200, path
    exported = admin.http.get("/admin/audit.csv", params={"action": "account.", "since": "1h"})
    assert exported.status_code == 200 and exported.text.startswith("at,actor,action,target,address,details")
    assert web_person in exported.text
    secrets += [password, key, web_password, web_password + "x"]
    rows = audit_rows(server)

    def found(action: str, **fields: str) -> dict:
        matches = [r for r in rows if r["action"] == action and all(r[k] == v for k, v in fields.items())]
        assert matches, f"no {action} entry with {fields}"
        return matches[-1]

    found("sign_in.succeeded", actor=ALICE[0], address=good)
    found("sign_in.failed", actor=ALICE[0], address=bad)
    assert json.loads(found("api_key.created", actor="cli", target=person)["details"])["prefix"] == key[:12]
    found("api_key.revoked", actor="cli")
    found("account.added", actor="cli", target=person)
    found("account.role_changed", actor="cli", target=person)
    found("account.removed", actor="cli", target=person)
    found("conversation.deleted", target=thread_id)
    for action in ("account.added", "account.role_changed", "account.password_reset", "account.removed"):
        entry = found(action, actor=ADMIN[0], target=web_person, address="127.0.0.1")
        assert json.loads(entry["details"])["via"] == "admin"
    found("audit.exported", actor=ADMIN[0])
    started = json.loads(found("service.started", actor="system")["details"])
    assert started["AUTH_MODE"] == "password" and started["sign_in"] == "password"
    assert started["OPS_TOKEN"] == started["ADMIN_PASSWORD"] == "***"
    assert started["ADMIN_USERNAME"] == ADMIN[0]
    with sqlite3.connect(data_dir(server) / "chat.db") as db:
        everything = "\n".join(" ".join(map(str, row)) for row in db.execute("SELECT * FROM audit_log"))
    leaked = [secret[:6] + "…" for secret in secrets if secret and secret in everything]
    assert not leaked, f"the audit log holds secrets: {leaked}"


async def _sign_ins(server: AppServer, good: str, bad: str, secrets: list[str]) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
        right = await http.post("/login", data={"username": ALICE[0], "password": ALICE[1]},
                                headers={"X-Forwarded-For": good})  # fmt: skip
        assert right.status_code == 200
        secrets.append(right.cookies["access_token"])
        wrong = await http.post("/login", data={"username": ALICE[0], "password": "not-" + ALICE[1]},
                                headers={"X-Forwarded-For": bad})  # fmt: skip
        assert wrong.status_code == 401
        secrets.append("not-" + ALICE[1])


async def _deleted_conversation(server: AppServer, secrets: list[str]) -> str:
    name, password = new_person(server)
    secrets.append(password)
    client = ChatClient(server.base_url, name, password)
    await client.connect()
    try:
        assert (await client.ask("A conversation to delete.")).final is not None
        thread_id = await client.conversation_id()
        await stored_thread(client, thread_id, steps=2)
        assert (
            await client.http("DELETE", "/project/thread", json={"threadId": thread_id})
        ).status_code == 200
    finally:
        await client.close()
    return thread_id


def test_the_audit_page_filters_and_refuses_bad_filters(server: AppServer) -> None:
    admin = AdminClient(server)
    person, _ = new_person(server)
    page = admin.http.get("/admin/audit", params={"actor": "cli", "action": "account.added", "since": "1h"})
    assert page.status_code == 200 and person in page.text
    other = admin.http.get("/admin/audit", params={"actor": "system", "action": "account.added"})
    assert person not in other.text
    for bad in ({"since": "yesterday"}, {"action": "x' OR 1=1 --"}, {"actor": "a" * 300}):
        refused = admin.http.get("/admin/audit", params=bad)
        assert refused.status_code == 400 and 'class="error"' in refused.text, bad
    assert admin.http.get("/admin/audit.csv", params={"since": "soon"}).status_code == 400


def test_usage_per_person_per_day_and_a_budget_set_on_the_page(server: AppServer) -> None:
    """A person chats; the administrator sees their day's usage, downloads it as CSV, gives them a
    budget of their own (the command line shows it) and puts them back on the role's; each is audited."""
    name, password = new_person(server)

    async def chat() -> None:
        client = ChatClient(server.base_url, name, password, address=new_address())
        await client.connect()
        try:
            assert (await client.ask("Count me in.")).final
        finally:
            await client.close()

    asyncio.run(chat())
    admin = AdminClient(server)
    listed = ""

    def usage_listed() -> bool:
        nonlocal listed
        listed = admin.http.get("/admin/usage", params={"person": name, "days": "1"}).text
        return f"<td>{name}</td>" in listed

    flush_seconds = Settings.from_env(server.env).usage_flush_seconds  # how often usage is written
    until_sync(usage_listed, "the person's usage listed", flush_seconds + WAIT_SECONDS, interval=0.5)
    assert "Per day" in listed, listed[-2000:]
    exported = admin.http.get("/admin/usage.csv", params={"person": name})
    assert exported.status_code == 200 and exported.text.splitlines()[0].startswith("person,day")
    assert any(line.startswith(f"{name},") for line in exported.text.splitlines()), exported.text
    refused = admin.post("/admin/usage/set-quota", person=name, day="-5")
    assert refused.status_code == 400 and "whole number" in refused.text
    assert admin.post("/admin/usage/set-quota", person="nobody-" + name, month="5").status_code == 400
    done = admin.post("/admin/usage/set-quota", person=name, day="0", month="123456")
    assert done.status_code == 200 and f"{name}&#x27;s budget is set" in done.text, done.text[-1500:]
    shown = subprocess_usage(server, "quota", "show", name)
    assert "123,456 tokens (own budget" in shown and "unlimited (own budget" in shown, shown
    assert admin.post("/admin/usage/clear-quota", person=name).status_code == 200
    assert "own budget" not in subprocess_usage(server, "quota", "show", name)
    done_actions = [(r["action"], r["target"]) for r in audit_rows(server) if r["actor"] == ADMIN[0]]
    for action in ("usage.exported", "quota.set", "quota.cleared"):
        assert (action, name) in done_actions, (action, done_actions[-10:])


def subprocess_usage(server: AppServer, *args: str) -> str:
    """`python -m services.usage ...` on the server's database, as an operator runs it."""
    env = {**os.environ, "DATA_DIR": str(data_dir(server))}
    result = subprocess.run([sys.executable, "-m", "services.usage", *args], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=300, check=True)  # fmt: skip
    return result.stdout
