"""Every size a client chooses is bounded before anything is stored: request bodies, conversation
names, feedback comments, the sidebar's list."""

from __future__ import annotations

import asyncio
import sqlite3
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from harness.chat_client import ChatClient
from harness.server import AppServer
from services.web.body_limit import limits_by_route
from tests.test_people import accounts

in_loop = pytest.mark.asyncio(loop_scope="package")

MB = 1024 * 1024
MAX_MESSAGE_CHARS = 100_000  # the default of the shared server
_people = iter(range(1_000_000))


def database(server: AppServer) -> sqlite3.Connection:
    return sqlite3.connect(Path(server.env["DATA_DIR"]) / "chat.db", timeout=10)


def rows(server: AppServer, query: str, *params: Any) -> list[tuple]:
    with database(server) as db:
        return db.execute(query, params).fetchall()


async def person(server: AppServer, name: str) -> ChatClient:
    """A signed-in person of their own (the per-person limits of other tests do not reach them)."""
    who = f"{name}-{next(_people)}-{uuid.uuid4().hex[:6]}"
    await asyncio.to_thread(accounts, Path(server.env["DATA_DIR"]), "add", who, stdin="a-long-password\n")
    client = ChatClient(server.base_url, who, "a-long-password")
    await client.connect()
    return client


async def until(predicate, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.1)


def stored_steps_of(server: AppServer, who: str) -> list[tuple]:
    return rows(
        server,
        'SELECT s."id", s."type", s."output", s."name", s."metadata", s."parentId", s."command" FROM steps s '
        'JOIN threads t ON t."id" = s."threadId" WHERE t."userIdentifier" = ?',
        who,
    )


# --- request bodies ---------------------------------------------------------------------------------
async def chunks(size: int) -> AsyncIterator[bytes]:
    for _ in range(size // (64 * 1024)):
        yield b"x" * (64 * 1024)


@in_loop
async def test_oversized_bodies_get_413_on_every_route(target: AppServer) -> None:
    client = await person(target, "sender")
    assert (await client.ask("Something.")).final is not None
    huge = "n" * (20 * MB)
    for method, path, body in (
        ("PUT", "/project/thread", {"threadId": client.thread_id, "name": huge}),
        ("PUT", "/feedback", {"sessionId": client.session_id, "feedback": {"forId": "x", "value": 1,
                                                                            "comment": huge}}),
        ("POST", "/project/threads", {"pagination": {"first": 20}, "filter": {"search": huge}}),
        ("POST", "/auth/jwt", {"token": huge}),
        ("DELETE", "/project/thread", {"threadId": huge}),
    ):  # fmt: skip
        response = await client.http(method, path, json=body)
        assert response.status_code == 413, (path, response.status_code, response.text[:200])
        assert "larger than 1,048,576 bytes" in response.json()["detail"]
    async with httpx.AsyncClient(base_url=target.base_url, timeout=30) as anonymous:
        form = {"content-type": "application/x-www-form-urlencoded"}
        login = await anonymous.post("/login", content=b"username=" + b"a" * (2 * MB), headers=form)
        signed_in = {"content-type": "application/json", "cookie": client.cookie or ""}
        streamed = await anonymous.put("/project/thread", content=chunks(4 * MB), headers=signed_in)
        polling = await anonymous.post(
            "/ws/socket.io/?EIO=4&transport=polling&sid=x", content=b"4" * (2 * MB)
        )
    assert (login.status_code, streamed.status_code, polling.status_code) == (413, 413, 413)
    assert rows(target, "SELECT COUNT(*) FROM threads WHERE length(name) > 1000") == [(0,)]
    await client.close()


@in_loop
async def test_long_names_and_comments_are_refused_and_an_automatic_name_is_cut(target: AppServer) -> None:
    client = await person(target, "namer")
    first = "w" * 5000  # Chainlit names the conversation after its first message
    assert (await client.ask(first)).final is not None
    await until(
        lambda: (
            rows(target, 'SELECT name FROM threads WHERE "id" = ?', client.thread_id) not in ([], [(None,)])
        )
    )
    assert rows(target, 'SELECT length(name) FROM threads WHERE "id" = ?', client.thread_id) == [(200,)]
    rename = {"threadId": client.thread_id}
    refused = await client.http("PUT", "/project/thread", json={**rename, "name": "n" * 900_000})
    assert refused.status_code == 400 and "at most 200 characters" in refused.json()["detail"]
    assert (await client.http("PUT", "/project/thread", json={**rename, "name": "Short"})).status_code == 200
    await until(lambda: any(s[1] == "assistant_message" for s in stored_steps_of(target, client.username)))
    answer_id = next(s[0] for s in stored_steps_of(target, client.username) if s[1] == "assistant_message")
    feedback = {"sessionId": client.session_id, "feedback": {"forId": answer_id, "value": 0}}
    feedback["feedback"]["comment"] = "c" * 900_000
    refused = await client.http("PUT", "/feedback", json=feedback)
    assert refused.status_code == 400 and "the limit is 4,000" in refused.json()["detail"]
    feedback["feedback"]["comment"] = "Too short an answer."
    assert (await client.http("PUT", "/feedback", json=feedback)).status_code == 200
    assert rows(target, 'SELECT comment FROM feedbacks WHERE "forId" = ?', answer_id) == [
        ("Too short an answer.",)
    ]
    assert rows(target, 'SELECT name FROM threads WHERE "id" = ?', client.thread_id) == [("Short",)]
    await client.close()


# --- the sidebar's list -----------------------------------------------------------------------------
def fill_history(server: AppServer, who: str, threads: int, step_bytes: int) -> None:
    """`threads` conversations of `who`, each with one message of `step_bytes`, written straight into
    the database (as months of use would leave them), plus one with a 1 MB name."""
    with database(server) as db:
        (user_id,) = db.execute("SELECT id FROM users WHERE identifier = ?", (who,)).fetchone()
        for index in range(threads):
            thread_id, at = str(uuid.uuid4()), f"2026-01-01T00:00:{index % 60:02d}.{index:06d}Z"
            name = "n" * MB if index == 0 else f"thread {index}"
            db.execute('INSERT INTO threads ("id", "createdAt", name, "userId", "userIdentifier", metadata) '
                       "VALUES (?, ?, ?, ?, ?, '{}')", (thread_id, at, name, user_id, who))  # fmt: skip
            db.execute('INSERT INTO steps ("id", name, type, "threadId", output, "createdAt", metadata) '
                       "VALUES (?, 'User', 'user_message', ?, ?, ?, '{}')",
                       (str(uuid.uuid4()), thread_id, "z" * step_bytes, at))  # fmt: skip


@in_loop
async def test_the_thread_list_answers_a_bounded_page_fast_without_messages(target: AppServer) -> None:
    client = await person(target, "hoarder")
    await asyncio.to_thread(fill_history, target, client.username, 150, 400_000)  # 60 MB of messages
    listed, cursor, pages = [], None, 0
    started = time.monotonic()
    while True:
        asked = {"pagination": {"first": 35, "cursor": cursor}, "filter": {}}
        response = await client.http("POST", "/project/threads", json=asked)
        assert response.status_code == 200 and len(response.content) < 64 * 1024, len(response.content)
        page = response.json()
        assert all(t["steps"] == [] and len(t["name"] or "") <= 200 for t in page["data"])
        listed += [t["id"] for t in page["data"]]
        pages += 1
        if not page["pageInfo"]["hasNextPage"]:
            break
        cursor = page["pageInfo"]["endCursor"]
    assert (time.monotonic() - started) / pages < 2.0, "each page is one small query"
    assert len(listed) == len(set(listed)) == 150 and pages == 5
    greedy = await client.http(
        "POST", "/project/threads", json={"pagination": {"first": 100_000}, "filter": {}}
    )
    assert len(greedy.json()["data"]) == 50 and greedy.json()["pageInfo"]["hasNextPage"]
    await client.close()


# --- the rules, without a server --------------------------------------------------------------------
def test_each_route_has_a_body_limit_or_a_guard_of_its_own() -> None:
    limit_for = limits_by_route(1000, 5000, "/project/file", api_served=True)

    def scope(method: str, path: str, root: str = "") -> dict[str, Any]:
        return {"type": "http", "method": method, "path": root + path, "root_path": root}

    assert limit_for(scope("PUT", "/project/thread")) == 1000
    assert limit_for(scope("GET", "/anything/at/all")) == 1000
    assert limit_for(scope("POST", "/ws/socket.io/", root="/chat")) == 5000, "one event, as engine.io reads"
    assert limit_for(scope("PUT", "/project/file")) == 1000, "only the upload itself has the upload's limit"
    assert limit_for(scope("POST", "/project/file")) is None, "UploadSizeGuard: MAX_UPLOAD_BYTES"
    assert limit_for(scope("POST", "/v1/chat/completions")) is None, "ApiGate: API_MAX_BODY_BYTES"
    assert limits_by_route(1000, 5000, "/project/file", api_served=False)(scope("POST", "/v1/x")) == 1000
