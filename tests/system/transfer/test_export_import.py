"""Export and import on the shared password server: a conversation goes out as Markdown and JSON and
comes back through import as a new conversation of the importer's own, which resumes with its turns;
nobody reaches another person's conversations through any of these routes; a bad file stores nothing."""

from __future__ import annotations

import json
import uuid

import httpx
import pytest

from harness.chat_client import ChatClient
from harness.server import AppServer
from tests.system.conftest import ALICE, BOB
from tests.system.helpers import LONG_TURN_WORDS, conversation_of, prompt_tokens_of, stored_thread

in_loop = pytest.mark.asyncio(loop_scope="module")


async def listed_ids(client: ChatClient) -> set[str]:
    response = await client.http(
        "POST", "/project/threads", json={"pagination": {"first": 100}, "filter": {}}
    )
    assert response.status_code == 200, response.text
    return {thread["id"] for thread in response.json()["data"]}


async def import_file(client: ChatClient, data: bytes, name: str = "archive.json") -> httpx.Response:
    return await client.http(
        "POST", "/conversations/import", files={"file": (name, data, "application/json")}
    )


def outputs(thread: dict) -> list[tuple[str, str]]:
    """The conversation's messages (Chainlit stores its "run" steps beside them)."""
    return [
        (s["type"], s["output"])
        for s in thread["steps"]
        if s["type"] in ("user_message", "assistant_message")
    ]


@in_loop
async def test_export_as_markdown_and_json_round_trips_through_import(password_server: AppServer) -> None:
    word = f"zebra{uuid.uuid4().hex[:8]}"
    alice, thread_id = await conversation_of(password_server, ALICE, f"Remember the word {word}.")
    try:
        original = outputs(await stored_thread(alice, thread_id, steps=2))
        as_json = await alice.http("GET", f"/conversations/{thread_id}/export", params={"format": "json"})
        as_md = await alice.http("GET", f"/conversations/{thread_id}/export", params={"format": "md"})
        assert as_json.status_code == as_md.status_code == 200, (as_json.text, as_md.text)
        assert as_json.headers["content-disposition"].startswith("attachment;")
        archive = as_json.json()
        assert (archive["format"], archive["version"]) == ("vllm-chat-archive", 1)
        [exported] = archive["conversations"]
        assert next((m["role"], m["content"]) for m in exported["messages"]) == (
            "user",
            f"Remember the word {word}.",
        )
        assert f"Remember the word {word}." in as_md.text and "**You**" in as_md.text
        assert thread_id not in as_json.text + as_md.text, "an export carries no ids"
        for data, name in ((as_json.content, "one.json"), (as_md.content, "one.md")):
            response = await import_file(alice, data, name)
            assert response.status_code == 200, response.text
            [new] = response.json()["conversations"]
            assert new["id"] != thread_id and new["title"] == exported["title"]
            assert outputs(await stored_thread(alice, new["id"], steps=2)) == original
            assert new["id"] in await listed_ids(alice)
    finally:
        await alice.close()


@in_loop
async def test_all_of_ones_conversations_export_as_one_archive(password_server: AppServer) -> None:
    word = f"okapi{uuid.uuid4().hex[:8]}"
    alice, _ = await conversation_of(password_server, ALICE, f"The animal is {word}.")
    try:
        response = await alice.http("GET", "/conversations/export")
        assert response.status_code == 200, response.text
        archive = response.json()
        assert archive["format"] == "vllm-chat-archive" and "left_out" not in archive
        assert len(archive["conversations"]) == len(await listed_ids(alice))
        assert any(word in m["content"] for c in archive["conversations"] for m in c["messages"])
    finally:
        await alice.close()


@in_loop
async def test_an_imported_conversation_resumes_with_its_turns(password_server: AppServer) -> None:
    long_turn = "Note this. " + " ".join(f"fact{i}" for i in range(LONG_TURN_WORDS))
    messages = [{"role": "user", "content": long_turn}, {"role": "assistant", "content": "Noted."}]
    archive = {"format": "vllm-chat-archive", "version": 1,
               "conversations": [{"title": "Imported facts", "messages": messages}]}  # fmt: skip
    alice = ChatClient(password_server.base_url, *ALICE)
    await alice.connect()
    response = await import_file(alice, json.dumps(archive).encode())
    assert response.status_code == 200, response.text
    [new] = response.json()["conversations"]
    await alice.leave()
    resumed = ChatClient(password_server.base_url, cookie=alice.cookie)
    try:
        thread = await resumed.resume(new["id"])
        assert outputs(thread) == [("user_message", long_turn), ("assistant_message", "Noted.")]
        tokens = await prompt_tokens_of(password_server, resumed, "What did I note?")
        assert tokens > LONG_TURN_WORDS, "the model got the imported turns back"
    finally:
        await resumed.close()


def chatgpt_export(node_ids: list[str]) -> bytes:
    """ChatGPT's shape, with a branch: the shown one ends at the last node; its ids are `node_ids`."""
    root, question, old, new = node_ids

    def node(key: str, role: str | None, text: str, parent: str | None, children: list[str]) -> dict:
        message = {"id": key, "author": {"role": role}, "create_time": 1_700_000_000.0,
                   "content": {"content_type": "text", "parts": [text]}} if role else None  # fmt: skip
        return {"id": key, "message": message, "parent": parent, "children": children}

    mapping = {
        root: node(root, None, "", None, [question]),
        question: node(question, "user", "Which branch?", root, [old, new]),
        old: node(old, "assistant", "The old branch.", question, []),
        new: node(new, "assistant", "The shown branch.", question, []),
    }
    return json.dumps([{"title": "ChatGPT talk", "create_time": 1_700_000_000.0, "mapping": mapping,
                        "current_node": new, "id": node_ids[0]}]).encode()  # fmt: skip


@in_loop
async def test_bob_reaches_none_of_alices_conversations(password_server: AppServer) -> None:
    secret = f"alicesecret{uuid.uuid4().hex[:8]}"
    alice, thread_id = await conversation_of(password_server, ALICE, f"My secret is {secret}.")
    bob = ChatClient(password_server.base_url, *BOB)
    await bob.connect()
    try:
        before = outputs(await stored_thread(alice, thread_id, steps=2))
        step_ids = [s["id"] for s in (await stored_thread(alice, thread_id, steps=2))["steps"]]
        for thread in (thread_id, str(uuid.uuid4()), "x' OR '1'='1", "x" * 5000):
            for method, path, kwargs in (
                ("GET", f"/conversations/{thread}/export", {"params": {"format": "json"}}),
                ("GET", f"/conversations/{thread}/export", {"params": {"format": "md"}}),
                ("POST", f"/conversations/{thread}/share", {}),
                ("DELETE", f"/conversations/{thread}/share", {}),
            ):
                response = await bob.http(method, path, **kwargs)
                assert response.status_code == 404 and secret not in response.text, (
                    method,
                    path,
                    response.text,
                )
        everything = await bob.http("GET", "/conversations/export")
        assert everything.status_code == 200 and secret not in everything.text
        async with httpx.AsyncClient(base_url=password_server.base_url) as nobody:
            for path in (f"/conversations/{thread_id}/export", "/conversations/export"):
                assert (await nobody.get(path)).status_code == 401
            assert (
                await nobody.post("/conversations/import", files={"file": ("a.json", b"[]")})
            ).status_code == 401
        # Bob imports a file whose ids are Alice's thread and messages: new ids, Alice's rows untouched
        response = await import_file(bob, chatgpt_export([thread_id, *step_ids, str(uuid.uuid4())][:4]))
        assert response.status_code == 200, response.text
        [new] = response.json()["conversations"]
        assert new["id"] not in (thread_id, *step_ids)
        assert new["id"] in await listed_ids(bob) and new["id"] not in await listed_ids(alice)
        assert outputs(await stored_thread(alice, thread_id, steps=2)) == before
        assert (await alice.http("GET", f"/conversations/{new['id']}/export")).status_code == 404
        imported = await stored_thread(bob, new["id"], steps=2)
        assert outputs(imported) == [
            ("user_message", "Which branch?"),
            ("assistant_message", "The shown branch."),
        ]
        assert not {s["id"] for s in imported["steps"]} & {thread_id, *step_ids}
    finally:
        await alice.close()
        await bob.close()


@in_loop
async def test_a_bad_file_leaves_nothing_stored(password_server: AppServer) -> None:
    """A file whose last conversation is bad stores none of the good ones before it, and files past
    the size limits are refused on the route. Every bad file of the readers (this one, a body nested
    past the parser, an image, an empty file, a ChatGPT cycle) is a unit test:
    tests/unit/test_transfer_import.py::test_the_servers_bad_files_are_refused_before_anything_is_stored."""
    bob = ChatClient(password_server.base_url, *BOB)
    await bob.connect()
    try:
        before = await listed_ids(bob)
        good = {"title": "good", "messages": [{"role": "user", "content": "fine"}]}
        bad = {"title": "bad", "messages": [{"role": "user", "content": 7}]}
        bad_last = {"format": "vllm-chat-archive", "version": 1, "conversations": [good, good, bad]}
        response = await import_file(bob, json.dumps(bad_last).encode())
        assert response.status_code == 400, response.text
        assert "Conversation 3, message 1: the content must be text" in response.json()["detail"]
        limit = 20 * 1024 * 1024  # IMPORT_MAX_BYTES's default
        just_over = await import_file(bob, b" " * (limit + 1))
        assert just_over.status_code == 400 and "larger than 20,971,520 bytes" in just_over.text
        far_over = await import_file(bob, b" " * (limit + 1024 * 1024))  # refused before it is read
        assert far_over.status_code == 413, far_over.text
        assert await listed_ids(bob) == before, "nothing was stored"
        assert password_server.healthz()[0] == 200
    finally:
        await bob.close()
