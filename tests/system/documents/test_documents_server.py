"""Uploads through the real server: summaries (one pass and map-reduce), bad files, the size guard."""

from __future__ import annotations

import asyncio
import re
import socket
import time

import httpx
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness import documents as build
from harness.chat_client import ChatClient, sign_in
from harness.server import AppServer
from tests.conftest import TINY_MAX_UPLOAD_BYTES
from tests.system.helpers import connected, idle

pytestmark = pytest.mark.asyncio(loop_scope="module")

PDF = "application/pdf"
DOCX = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"
SHORT_TEXT = build.long_document(300, seed=1)
LONG_TEXT = build.long_document(4000, seed=2)  # ~5,000 tokens: over the tiny model's 4,096 context


def step_outputs(client: ChatClient, name: str) -> list[str]:
    return [m.get("output", "") for m in client.messages.values() if m.get("name") == name]


def notice_texts(client: ChatClient) -> list[str]:
    return [m["output"] for m in client.messages.values() if m.get("name") == "notice"]


def error_texts(client: ChatClient) -> list[str]:
    return [m.get("output", "") for m in client.messages.values() if m.get("isError")]


async def upload_and_ask(client: ChatClient, name: str, data: bytes, mime: str, text: str = ""):
    file_id = await client.upload(name, data, mime)
    return await client.ask(text, file_ids=[file_id], timeout=300)


async def error_shown(client: ChatClient, words: str, timeout: float = 30) -> None:
    """Wait for an error message with `words` in it to reach `client` (checked every 50 ms)."""
    deadline = time.monotonic() + timeout
    while not any(words in text for text in error_texts(client)):
        assert time.monotonic() < deadline, f"no error with {words!r} in {timeout} s: {error_texts(client)}"
        await asyncio.sleep(0.05)


def aborted_requests(server: AppServer) -> float:
    """Engine requests of the chat (answers, summary steps) ended by an abort so far, from /metrics."""
    with server.open("/metrics") as response:
        text = response.read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "chat_requests_finished_total" and sample.labels.get("finished_reason") == "abort"
    )


async def test_short_document_is_summarized_in_one_pass(tiny_server: AppServer) -> None:
    async with connected(tiny_server) as (client,):
        reply = await upload_and_ask(client, "notes.txt", SHORT_TEXT.encode(), "text/plain")
        assert reply.final and reply.streamed_text == reply.final
        progress = step_outputs(client, "Summarizing")
        assert not any("parts" in out for out in progress), "a short document needs no map-reduce"
        assert any("tokens" in out for out in step_outputs(client, "Reading the document"))
        follow_up = await client.ask("What is the main point?")
        assert follow_up.final and "⚠️" not in follow_up.final
        second = await upload_and_ask(client, "minutes.md", SHORT_TEXT.encode(), "text/markdown")
        assert second.final
        replaced = "«notes.txt» is put aside: questions now go to «minutes.md»"
        assert any(replaced in text for text in notice_texts(client)), notice_texts(client)
    await tiny_server.poll(idle, timeout=10)


@pytest.mark.parametrize(
    ("name", "mime", "make"),
    [
        ("report.pdf", PDF, lambda: build.make_pdf(LONG_TEXT.split("\n\n"))),
        ("report.docx", DOCX, lambda: build.make_docx(LONG_TEXT.split("\n\n"))),
    ],
)
async def test_long_document_is_summarized_by_map_reduce(tiny_server: AppServer, name, mime, make) -> None:
    async with connected(tiny_server) as (client,):
        reply = await upload_and_ask(client, name, make(), mime, "Summarize this report.")
        assert reply.final and "⚠️" not in reply.final
        progress = step_outputs(client, "Summarizing")
        assert progress and progress[-1].startswith("Read "), progress  # "Read N tokens in K parts in S s."
        parts = int(re.search(r" in (\d+) parts", progress[-1]).group(1))
        assert parts >= 5, "a 4,000-word document is split into chunks sized for the context"
        planned = [text for text in notice_texts(client) if "summarized in parts (map-reduce)" in text]
        assert planned and "retrieval" in planned[0], "the user is told up front how the document is read"
        question = await client.ask("Which figures does the report mention?")
        assert question.final and "⚠️" not in question.final, "follow-ups use the most relevant chunks"
    await tiny_server.poll(idle, timeout=10)


async def test_same_document_summary_comes_from_the_cache(tiny_server: AppServer) -> None:
    async with connected(tiny_server) as (client,):
        data = build.long_document(500, seed=9).encode()
        first = await upload_and_ask(client, "a.md", data, "text/markdown")
        second = await upload_and_ask(client, "a.md", data, "text/markdown")
        assert second.final == first.final, "the cached summary is returned as is"
        assert len(second.streamed) == 1, "a cached summary arrives at once"


async def test_stop_during_map_reduce_aborts_every_chunk(tiny_server: AppServer) -> None:
    async with connected(tiny_server) as (client,):
        await client.update_settings(temperature=1.0)  # a fresh cache key
        file_id = await client.upload("big.txt", build.long_document(6000, seed=4).encode(), "text/plain")
        await client.send("Summarize, please.", file_ids=[file_id])
        await tiny_server.poll(lambda s: s["engine_unfinished_requests"] >= 2, timeout=60, interval=0.01)
        aborted_before = await asyncio.to_thread(aborted_requests, tiny_server)
        await client.stop()
        # The end is waited for; the abort is told by the app's count of aborted requests, not a clock.
        status = await tiny_server.poll(idle, timeout=30)
        assert status["engine_unfinished_requests"] == 0
        aborted = await asyncio.to_thread(aborted_requests, tiny_server) - aborted_before
        assert aborted >= 1, "the running chunks ran to their end instead of being aborted"
        assert (await client.ask("Are you still there?")).final


async def test_a_file_dropped_before_the_page_connects_waits_for_it(tiny_server: AppServer) -> None:
    """The page may post a file before its socket has connected; the upload waits for the connection
    instead of failing with Chainlit's "Session not found"."""
    client = ChatClient(tiny_server.base_url)
    client.cookie = await sign_in(tiny_server.base_url, client.username, client.password)
    upload = asyncio.create_task(client.upload("early.txt", SHORT_TEXT.encode(), "text/plain"))
    await asyncio.sleep(0.5)
    assert not upload.done(), "held until the page connects"
    await client.connect()
    try:
        reply = await client.ask("", file_ids=[await upload], timeout=300)
        assert reply.final and "⚠️" not in reply.final
    finally:
        await client.close()


async def test_empty_upload_is_refused_with_a_message(tiny_server: AppServer) -> None:
    async with connected(tiny_server) as (client,):
        with pytest.raises(httpx.HTTPStatusError, match="400"):
            await client.upload("empty.txt", b"", "text/plain")
        await error_shown(client, "is empty")
        assert (await client.ask("Hello?")).final


# One text upload and one Word document that would unpack to 200 MiB in the server's process.
BAD_FILES = [
    ("blank.txt", "text/plain", lambda: b" \n\t \n", "contains no text"),
    ("bomb.docx", DOCX, lambda: build.make_docx_zip_bomb(200 * 2**20), "suspiciously heavily"),
]


@pytest.mark.parametrize(("name", "mime", "make", "message"), BAD_FILES, ids=[b[0] for b in BAD_FILES])
async def test_bad_file_gets_a_clear_message(tiny_server: AppServer, name, mime, make, message) -> None:
    """An unreadable upload is refused in the chat with its message, and the session goes on. Every
    bad file (these two, photo.pdf, noise.pdf, locked.pdf, scan.pdf, broken.docx) is a unit test:
    tests/unit/test_documents.py::test_a_bad_upload_is_refused_with_its_message."""
    async with connected(tiny_server) as (client,):
        file_id = await client.upload(name, make(), mime)
        await client.send("", file_ids=[file_id])
        await tiny_server.poll(idle, timeout=30)
        await error_shown(client, message)
        assert (await client.ask("Hello?")).final, "the session keeps working"


async def test_invalid_utf8_is_replaced_and_said(tiny_server: AppServer) -> None:
    async with connected(tiny_server) as (client,):
        reply = await upload_and_ask(client, "odd.txt", build.invalid_utf8_text(), "text/plain")
        assert reply.final
        assert any("not valid UTF-8" in text for text in notice_texts(client)), notice_texts(client)


def post_raw_upload(port: int, session_id: str, body_bytes: int, chunked: bool) -> bytes:
    """Send a whole multipart upload of `body_bytes`, declared by Content-Length or chunked,
    then read the start of the server's response, as a browser does."""
    part = b'--b\r\nContent-Disposition: form-data; name="file"; filename="big.txt"\r\n\r\n'
    tail = b"\r\n--b--\r\n"
    length = len(part) + body_bytes + len(tail)
    framing = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {length}"
    head = (
        f"POST /project/file?session_id={session_id} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Content-Type: multipart/form-data; boundary=b\r\n{framing}\r\n\r\n"
    ).encode()
    chunk = b"x" * 2**20

    def frame(data: bytes) -> bytes:
        return f"{len(data):x}\r\n".encode() + data + b"\r\n" if chunked else data

    with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
        conn.sendall(head + frame(part))
        for _ in range(body_bytes // len(chunk)):
            conn.sendall(frame(chunk))
        conn.sendall(frame(tail) + (b"0\r\n\r\n" if chunked else b""))
        time.sleep(0.2)  # a slow reader: a server that closed without reading would reset us
        return conn.recv(4096)


async def test_oversized_upload_is_refused_before_it_is_read(tiny_server: AppServer) -> None:
    server = psutil.Process(tiny_server.process.pid)
    async with connected(tiny_server) as (client,):
        rss_before = server.memory_info().rss
        async with httpx.AsyncClient(base_url=tiny_server.base_url, timeout=60) as http:
            declared = await http.post(
                "/project/file", params={"session_id": client.session_id},
                files={"file": ("big.txt", b"x" * (TINY_MAX_UPLOAD_BYTES + 1), "text/plain")},
            )  # fmt: skip
        assert declared.status_code == 413
        assert "File too large" in declared.json()["detail"]
        for chunked in (False, True):
            answer = await asyncio.to_thread(
                post_raw_upload, tiny_server.port, client.session_id, 200 * 2**20, chunked
            )
            assert answer.startswith(b"HTTP/1.1 413"), answer[:100]
        grown_mb = (server.memory_info().rss - rss_before) / 2**20
        assert grown_mb < 50, f"the server read the oversized body: RSS grew {grown_mb:.0f} MB"
        await error_shown(client, "Upload refused")  # the chat is told too
