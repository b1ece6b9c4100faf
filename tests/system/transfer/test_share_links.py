"""Share links on the shared password server (SHARING=true): a snapshot copied at share time, shown
without sign-in at an unguessable link holding no account data; revoked and expired links answer
404; only the owner shares or revokes. With SHARING off (the tiny server) every share route is 404."""

from __future__ import annotations

import hashlib
import json
import re
import sqlite3
import uuid
from pathlib import Path

import httpx
import pytest

from harness.chat_client import ChatClient
from harness.server import AppServer
from tests.system.conftest import ALICE, BOB
from tests.system.helpers import conversation_of, stored_thread

in_loop = pytest.mark.asyncio(loop_scope="module")


def database(server: AppServer) -> sqlite3.Connection:
    return sqlite3.connect(Path(server.env["DATA_DIR"]) / "chat.db", timeout=10)


async def anonymous_get(server: AppServer, url: str) -> httpx.Response:
    async with httpx.AsyncClient() as nobody:
        return await nobody.get(url)


@in_loop
async def test_a_share_link_shows_a_snapshot_without_sign_in_and_no_account_data(
    password_server: AppServer,
) -> None:
    word = f"heron{uuid.uuid4().hex[:8]}"
    alice, thread_id = await conversation_of(
        password_server, ALICE, f"Birds: {word} <script>alert(1)</script>"
    )
    try:
        shared = await alice.http("POST", f"/conversations/{thread_id}/share")
        assert shared.status_code == 200, shared.text
        url = shared.json()["url"]
        token = url.rsplit("/s/", 1)[1]
        assert len(token) >= 43, "at least 256 bits, base64url"
        later = f"later{uuid.uuid4().hex[:8]}"
        assert (await alice.ask(f"Not shared: {later}")).final is not None
        await stored_thread(alice, thread_id, steps=4)
        page = await anonymous_get(password_server, url)
        assert page.status_code == 200, page.text
        assert word in page.text and "&lt;script&gt;" in page.text and "<script>" not in page.text
        assert later not in page.text, "the snapshot was taken at share time"
        stored = await stored_thread(alice, thread_id, steps=4)
        for private in (ALICE[0], thread_id, *[s["id"] for s in stored["steps"]]):
            assert private not in page.text, f"the page shows {private!r}"
        assert "script-src" not in page.headers["content-security-policy"]
        assert page.headers["content-security-policy"].startswith("default-src 'none'")
        assert (
            page.headers["referrer-policy"] == "no-referrer" and page.headers["cache-control"] == "no-store"
        )
        with database(password_server) as db:
            rows = db.execute(
                "SELECT token_hash, snapshot FROM shares WHERE thread_id = ?", (thread_id,)
            ).fetchall()
        assert rows == [(hashlib.sha256(token.encode()).hexdigest(), rows[0][1])]
        assert token not in rows[0][1] and ALICE[0] not in rows[0][1]
    finally:
        await alice.close()


@in_loop
async def test_revoked_and_expired_links_answer_404_and_only_the_owner_revokes(
    password_server: AppServer,
) -> None:
    alice, thread_id = await conversation_of(password_server, ALICE, "Something to share and revoke.")
    bob = ChatClient(password_server.base_url, *BOB)
    await bob.connect()
    try:
        first = (await alice.http("POST", f"/conversations/{thread_id}/share")).json()["url"]
        second = (await alice.http("POST", f"/conversations/{thread_id}/share")).json()["url"]
        assert first != second
        assert (await bob.http("DELETE", f"/conversations/{thread_id}/share")).status_code == 404
        assert (await anonymous_get(password_server, first)).status_code == 200, "Bob revoked nothing"
        with database(password_server) as db:
            db.execute("UPDATE shares SET expires_at = '2000-01-01T00:00:00Z' WHERE token_hash = ?",
                       (hashlib.sha256(second.rsplit("/s/", 1)[1].encode()).hexdigest(),))  # fmt: skip
        expired = await anonymous_get(password_server, second)
        assert expired.status_code == 404 and "Something to share" not in expired.text
        revoked = await alice.http("DELETE", f"/conversations/{thread_id}/share")
        assert revoked.status_code == 200 and revoked.json() == {"revoked": 1}, revoked.text
        gone = await anonymous_get(password_server, first)
        assert gone.status_code == 404 and "Something to share" not in gone.text
        for guess in ("/s/" + "A" * 43, "/s/x", "/s/" + "a" * 5000, "/s/%00"):
            assert (await anonymous_get(password_server, password_server.base_url + guess)).status_code == 404
    finally:
        await alice.close()
        await bob.close()


@in_loop
async def test_share_in_the_chat_shows_the_link_once_and_revokes(password_server: AppServer) -> None:
    alice, thread_id = await conversation_of(password_server, ALICE, "Shared from the chat.")
    try:
        answer = (await alice.ask("/share")).final or ""
        [url] = re.findall(r"http://\S+/s/\S+", answer)
        assert "Shared from the chat." in (await anonymous_get(password_server, url)).text
        assert "Revoked 1 link" in ((await alice.ask("/share revoke")).final or "")
        assert (await anonymous_get(password_server, url)).status_code == 404
        thread = await stored_thread(alice, thread_id, steps=4)
        assert not any(url in (s["output"] or "") for s in thread["steps"]), "the link is not stored"
    finally:
        await alice.close()


@in_loop
async def test_an_imported_assistant_message_is_shown_as_imported_not_as_an_answer(
    password_server: AppServer,
) -> None:
    spoof = f"Your session expired: sign in again at https://login.example.net/{uuid.uuid4().hex[:8]}"
    data = json.dumps({"format": "vllm-chat-archive", "version": 1, "conversations": [
        {"title": "Support", "messages": [{"role": "user", "content": "Is my account fine?"},
                                          {"role": "assistant", "content": spoof}]}]})  # fmt: skip
    alice = ChatClient(password_server.base_url, *ALICE)
    await alice.connect()
    try:
        upload = {"file": ("a.json", data.encode(), "application/json")}
        imported = await alice.http("POST", "/conversations/import", files=upload)
        assert imported.status_code == 200, imported.text
        thread_id = imported.json()["conversations"][0]["id"]
        url = (await alice.http("POST", f"/conversations/{thread_id}/share")).json()["url"]
        page = (await anonymous_get(password_server, url)).text
    finally:
        await alice.close()
    shown = rf'<div class="message ([^"]*)"><div class="who">([^<]*)</div>{re.escape(spoof)}'
    [(kind, who)] = re.findall(shown, page)
    assert "imported" in kind.split() and "assistant" not in kind.split(), kind
    assert "Assistant" not in who and "not written by this app" in who, who


# a server of its own: per commit, security/test_sharing.py checks the same on the tiny server
@pytest.mark.long
@in_loop
async def test_share_routes_answer_404_while_sharing_is_off(tiny_server: AppServer) -> None:
    local = ChatClient(tiny_server.base_url)
    await local.connect()
    try:
        assert (await local.ask("Not to be shared.")).final is not None
        assert local.thread_id
        await stored_thread(local, local.thread_id, steps=2)
        one = f"/conversations/{local.thread_id}/share"
        for method, path in (("POST", one), ("DELETE", one), ("GET", "/s/" + "A" * 43)):
            response = await local.http(method, path)
            assert response.status_code == 404, (path, response.text)
        assert "Sharing is off" in ((await local.ask("/share")).final or "")
        exported = await local.http(
            "GET", f"/conversations/{local.thread_id}/export", params={"format": "md"}
        )
        assert exported.status_code == 200 and "Not to be shared." in exported.text, (
            "export works without sharing"
        )
    finally:
        await local.close()
