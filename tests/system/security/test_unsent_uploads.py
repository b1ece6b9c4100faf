"""Uploads never sent in a message cannot fill the disk: per chat and per person they are bounded
(files and bytes) with a refusal the page shows, they are deleted after UNSENT_UPLOAD_SECONDS while
their page stays open, a file sent with a message reaches its turn and goes once the message has been
handled, and the element route writes nothing. The rule
alone, and the sweep on a Chainlit session in this process: tests/unit/security/test_unsent_uploads.py.

The server of this module is the local install (each client's X-Forwarded-For address is a person of
its own) with small bounds, a short expiry and a maintenance round every second."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from harness.chat_client import ChatClient, new_address
from harness.server import AppServer
from harness.waiting import WAIT_SECONDS, until
from tests.conftest import ServerPool, pooled
from tests.system.conftest import tiny_env
from tests.system.helpers import collect_replies, refusals

# a server of its own (small bounds, a short expiry): per commit, tests/unit/security/test_unsent_uploads.py
# checks the rule and runs the sweep and the route's refusal on a real Chainlit session in process
pytestmark = pytest.mark.long
in_loop = pytest.mark.asyncio(loop_scope="module")

MB = 1024 * 1024
FILES_PER_CHAT = 3
FILES_PER_PERSON = 4
MB_PER_CHAT = 5
EXPIRY_SECONDS = 20  # long enough for a test's few uploads and a short turn, short enough to wait for
LATER = f"Send them with a message first; files not sent within {EXPIRY_SECONDS} seconds are deleted."


@pooled
def uploads_server(server_pool: ServerPool, tiny_model_dir: Path) -> AppServer:
    env = tiny_env(
        tiny_model_dir, UNSENT_UPLOADS_PER_SESSION=FILES_PER_CHAT, UNSENT_UPLOADS_PER_PERSON=FILES_PER_PERSON,
        UNSENT_UPLOAD_MB_PER_SESSION=MB_PER_CHAT, UNSENT_UPLOAD_MB_PER_PERSON=8,
        UNSENT_UPLOAD_SECONDS=EXPIRY_SECONDS, MAINTENANCE_INTERVAL_SECONDS=1,
    )  # fmt: skip
    return server_pool.get(env, "uploads-server")


@contextlib.asynccontextmanager
async def pages(server: AppServer, count: int, address: str | None = None) -> AsyncIterator[list[ChatClient]]:
    """`count` connected pages of one person (one address), closed ("New chat") at the end."""
    address = address or new_address()
    clients = [ChatClient(server.base_url, address=address) for _ in range(count)]
    for client in clients:
        await client.connect()
    try:
        yield clients
    finally:
        await asyncio.gather(*(client.close() for client in clients), return_exceptions=True)


async def post_file(client: ChatClient, size: int = 100, name: str = "notes.txt") -> httpx.Response:
    """An upload as the page posts it, whatever the answer."""
    headers = {"X-Forwarded-For": client.address, **({"Cookie": client.cookie} if client.cookie else {})}
    async with httpx.AsyncClient(base_url=client.base_url, timeout=60, headers=headers) as http:
        return await http.post(
            "/project/file", params={"session_id": client.session_id},
            files={"file": (name, b"n" * size, "text/plain")},
        )  # fmt: skip


def refused_with(response: httpx.Response, status: int) -> str:
    """The sentence the page shows ("Failed to upload <name>: <detail>"): JSON's detail."""
    assert response.status_code == status, (response.status_code, response.text[:300])
    kind = response.headers["content-type"]
    assert kind.startswith("application/json"), f"{kind}: the page would only say 'Upload failed'"
    return response.json()["detail"]


def files_on_disk(server: AppServer, client: ChatClient) -> list[str]:
    """The ids of the files in the chat's folder (uploads, and what the app's answers attach)."""
    folder = Path(server.env["CHAINLIT_APP_ROOT"]) / ".files" / client.session_id
    return sorted(path.stem for path in folder.iterdir()) if folder.is_dir() else []


@in_loop
async def test_the_file_past_a_chats_bound_is_refused_with_a_message_the_page_shows(
    uploads_server: AppServer,
) -> None:
    async with pages(uploads_server, 1) as (page,):
        held = [(await post_file(page)).json()["id"] for _ in range(FILES_PER_CHAT)]
        refused = await post_file(page)
        told = f"This chat already holds {FILES_PER_CHAT} uploaded files not yet sent (at most 3). {LATER}"
        assert refused_with(refused, 429) == told
        assert files_on_disk(uploads_server, page) == sorted(held), "the refused file was never written"
        assert (await post_file(page)).status_code == 429, "and again"


@in_loop
async def test_a_persons_unsent_files_are_bounded_across_their_chats(uploads_server: AppServer) -> None:
    async with pages(uploads_server, 2) as (first, second), pages(uploads_server, 1) as (someone_else,):
        for page in (first, first, first, second):
            assert (await post_file(page)).status_code == 200
        detail = refused_with(await post_file(second), 429)
        assert f"You already hold {FILES_PER_PERSON} uploaded files not yet sent across your chats" in detail
        assert (await post_file(someone_else)).status_code == 200, "another person has their own bound"
        await first.close()  # "New chat": the chat goes, and its files with it
        await until(lambda: not files_on_disk(uploads_server, first), "the closed chat's folder deleted")
        assert (await post_file(second)).status_code == 200


@in_loop
async def test_unsent_bytes_past_a_chats_bound_are_refused_and_not_kept(uploads_server: AppServer) -> None:
    async with pages(uploads_server, 1) as (page,):
        kept = (await post_file(page, 3 * MB)).json()["id"]
        detail = refused_with(await post_file(page, 3 * MB), 413)
        assert detail == f"Uploaded files not yet sent may take {MB_PER_CHAT} MB per chat. " + LATER
        assert files_on_disk(uploads_server, page) == [kept]
        assert (await post_file(page, MB)).status_code == 200


@in_loop
async def test_unsent_files_are_deleted_after_the_expiry_and_a_sent_one_is_read_by_its_turn(
    uploads_server: AppServer,
) -> None:
    async with pages(uploads_server, 1) as (page,):
        seen = collect_replies(page)
        sent = (await post_file(page, name="sent.txt")).json()["id"]
        unsent = (await post_file(page, name="unsent.txt")).json()["id"]
        assert (await page.ask("Read this.", file_ids=[sent])).final is not None
        await until(
            lambda: unsent not in files_on_disk(uploads_server, page),
            "the unsent file deleted while its page stays open",
            EXPIRY_SECONDS + WAIT_SECONDS,
            interval=0.2,
        )
        query = {"session_id": page.session_id}
        for file_id in (unsent, sent):  # the sent one: its turn read it (the app keeps the text only)
            assert (await page.http("GET", f"/project/file/{file_id}", params=query)).status_code == 404
        assert not refusals(seen, "upload_gone"), "the sent file reached its turn"
        await page.send("And this one?", file_ids=[unsent])
        await until(lambda: refusals(seen, "upload_gone"), "the sender told the file is gone")
        assert "Please attach it again." in refusals(seen, "upload_gone")[0]["output"]
        assert page.sio.connected


@in_loop
async def test_files_sent_with_a_message_that_reads_none_are_deleted_once_it_is_handled(
    uploads_server: AppServer,
) -> None:
    """A command reads no file: the files sent with it must not stay for the chat's life, outside
    the bounds (a message a minute of 5 large files each would fill the disk)."""
    async with pages(uploads_server, 1) as (page,):
        started = time.monotonic()
        sent = [(await post_file(page, MB)).json()["id"] for _ in range(FILES_PER_CHAT)]
        assert (await page.ask("/quota", file_ids=sent)).final is not None
        before_any_expired = started + EXPIRY_SECONDS - time.monotonic()  # so the sweep did not do it
        await until(lambda: not files_on_disk(uploads_server, page), "its files deleted", before_any_expired)
        for _ in range(FILES_PER_CHAT):
            assert (await post_file(page)).status_code == 200


@in_loop
async def test_custom_element_updates_are_refused_and_write_no_file(uploads_server: AppServer) -> None:
    async with pages(uploads_server, 1) as (page,):
        element = {"type": "custom", "name": "n", "display": "inline", "props": {"x": "y" * 10_000}}
        for _ in range(5):  # Chainlit wrote a new file for each
            body = {"sessionId": page.session_id, "element": {**element, "id": str(uuid.uuid4())}}
            response = await page.http("PUT", "/project/element", json=body)
            assert response.status_code == 403, (response.status_code, response.text[:200])
            assert response.json()["detail"] == "This app shows no custom elements: there is none to update."
        assert files_on_disk(uploads_server, page) == []
