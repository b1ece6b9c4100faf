"""UploadSizeGuard in front of tiny Starlette/FastAPI apps, through httpx's ASGI transport."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, UploadFile
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from services.web.upload_guard import (
    UPLOAD_LINGER_SECONDS,
    UploadSizeGuard,
    UploadWaitsForSession,
    install_upload_guard,
    too_large_detail,
)

MIB = 1024 * 1024
UPLOAD = "/project/file"


class Recorder:
    """A tiny Starlette app that reads the body, wrapped so we see what the server side did."""

    def __init__(self) -> None:
        self.handler_calls = 0
        self.receive_calls = 0  # calls that reached the transport (the real socket)
        self.headers: dict[str, str] = {}

        async def read_body(request: Request) -> JSONResponse:
            self.handler_calls += 1
            body = await request.body()
            return JSONResponse({"received": len(body)})

        self.app = Starlette(
            routes=[
                Route(UPLOAD, read_body, methods=["GET", "POST"]),
                Route("/other", read_body, methods=["POST"]),
            ]
        )

    def guarded(self, max_upload_bytes: int, linger_seconds: float = UPLOAD_LINGER_SECONDS) -> Any:
        guard = UploadSizeGuard(self.app, max_upload_bytes=max_upload_bytes, linger_seconds=linger_seconds)

        async def outer(scope: Any, receive: Any, send: Any) -> None:
            async def counted_receive() -> Any:
                self.receive_calls += 1
                return await receive()

            if scope["type"] == "http":
                self.headers = {name.decode(): value.decode() for name, value in scope["headers"]}
            await guard(scope, counted_receive, send)

        return outer


def client_for(app: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")


class ChunkStream:
    """An async body of `count` chunks of `size` bytes that records how many were pulled."""

    def __init__(self, count: int, size: int) -> None:
        self.count, self.size, self.pulled = count, size, 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for _ in range(self.count):
            self.pulled += 1
            yield b"x" * self.size


@pytest.mark.asyncio
async def test_content_length_over_limit_is_refused_without_reading_the_body() -> None:
    recorder = Recorder()
    async with client_for(recorder.guarded(MIB, linger_seconds=0)) as client:
        response = await client.post(UPLOAD, content=b"x" * (MIB + 1))
    assert response.status_code == 413
    assert response.json() == {"detail": "File too large: limit is 1 MB."}
    assert recorder.headers["content-length"] == str(MIB + 1)
    assert recorder.handler_calls == 0
    assert recorder.receive_calls == 0


@pytest.mark.asyncio
async def test_streamed_body_over_limit_is_cut_off_with_413() -> None:
    recorder = Recorder()
    body = ChunkStream(count=100, size=1024)  # 100 KiB in 1 KiB chunks
    async with client_for(recorder.guarded(10 * 1024, linger_seconds=0)) as client:
        response = await client.post(UPLOAD, content=body)
    assert "content-length" not in recorder.headers
    assert recorder.headers["transfer-encoding"] == "chunked"
    assert response.status_code == 413
    assert response.json() == {"detail": "File too large: limit is 10 KB."}
    assert body.pulled <= 12, f"the guard kept reading: {body.pulled} chunks pulled"


@pytest.mark.asyncio
async def test_refusal_discards_the_rest_of_the_body_so_the_client_reads_the_413() -> None:
    # A server that closes while the client still sends makes the client see a reset, not the
    # 413. The guard reads the rest and throws it away; the app never sees it.
    recorder = Recorder()
    declared = ChunkStream(count=100, size=1024)
    streamed = ChunkStream(count=100, size=1024)
    async with client_for(recorder.guarded(10 * 1024)) as client:
        by_header = await client.post(UPLOAD, content=declared, headers={"content-length": str(100 * 1024)})
        by_count = await client.post(UPLOAD, content=streamed)
    assert (by_header.status_code, by_count.status_code) == (413, 413)
    assert (declared.pulled, streamed.pulled) == (100, 100)
    assert recorder.handler_calls == 1, "only the streamed one reached the app, cut at the limit"


@pytest.mark.asyncio
async def test_discarding_the_rest_stops_after_linger_seconds() -> None:
    async def endless_receive() -> dict[str, Any]:
        await asyncio.sleep(0.01)
        return {"type": "http.request", "body": b"x" * 600, "more_body": True}

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    headers = [(b"content-length", b"999999999")]
    scope = {"type": "http", "method": "POST", "path": UPLOAD, "headers": headers}
    guard = UploadSizeGuard(lambda *args: None, max_upload_bytes=1000, linger_seconds=0.3)  # type: ignore[arg-type]
    started = time.monotonic()
    await guard(scope, endless_receive, send)
    assert 0.3 <= time.monotonic() - started < 3
    assert sent[0]["status"] == 413


@pytest.mark.asyncio
async def test_upload_under_or_at_the_limit_passes() -> None:
    recorder = Recorder()
    async with client_for(recorder.guarded(10 * 1024)) as client:
        small = await client.post(UPLOAD, content=b"y" * 5000)
        exact = await client.post(UPLOAD, content=ChunkStream(count=10, size=1024))
    assert (small.status_code, small.json()) == (200, {"received": 5000})
    assert (exact.status_code, exact.json()) == (200, {"received": 10 * 1024})
    assert recorder.handler_calls == 2


@pytest.mark.asyncio
async def test_other_paths_and_methods_are_untouched() -> None:
    recorder = Recorder()
    async with client_for(recorder.guarded(1024)) as client:
        other = await client.post("/other", content=b"z" * 5000)
        streamed = await client.post("/other", content=ChunkStream(count=8, size=1024))
        fetched = await client.request("GET", UPLOAD, content=b"z" * 5000)
    assert (other.status_code, other.json()) == (200, {"received": 5000})
    assert (streamed.status_code, streamed.json()) == (200, {"received": 8192})
    assert (fetched.status_code, fetched.json()) == (200, {"received": 5000})


@pytest.mark.asyncio
async def test_fastapi_form_upload_over_limit_gets_413_not_400() -> None:
    # FastAPI turns any error while parsing a form into 400: the guard must still answer 413.
    app = FastAPI()
    seen: list[int] = []

    @app.post(UPLOAD)
    async def upload(file: UploadFile) -> dict[str, int]:
        data = await file.read()
        seen.append(len(data))
        return {"size": len(data)}

    install_upload_guard(app, max_upload_bytes=20 * 1024)
    boundary = "guard-test-boundary"

    def multipart(size: int) -> list[bytes]:
        head = (
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="a.txt"\r\n'
            "Content-Type: text/plain\r\n\r\n"
        ).encode()
        data = b"d" * size
        return [head, *(data[i : i + 4096] for i in range(0, size, 4096)), f"\r\n--{boundary}--\r\n".encode()]

    async def stream(parts: list[bytes]) -> AsyncIterator[bytes]:
        for part in parts:
            yield part

    headers = {"content-type": f"multipart/form-data; boundary={boundary}"}
    async with client_for(app) as client:
        big = await client.post(UPLOAD, content=stream(multipart(200 * 1024)), headers=headers)
        small = await client.post(UPLOAD, content=stream(multipart(10 * 1024)), headers=headers)
        declared = await client.post(UPLOAD, files={"file": ("a.txt", b"e" * 50_000)})
    assert big.status_code == 413
    assert big.json() == {"detail": "File too large: limit is 20 KB."}
    assert (small.status_code, small.json()) == (200, {"size": 10 * 1024})
    assert declared.status_code == 413
    assert seen == [10 * 1024]


@pytest.mark.asyncio
async def test_websocket_and_lifespan_scopes_pass_through_unchanged() -> None:
    calls: list[tuple[Any, Any, Any]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        calls.append((scope, receive, send))

    async def receive() -> dict[str, Any]:
        return {"type": "lifespan.startup"}

    async def send(message: Any) -> None:
        pass

    guard = UploadSizeGuard(app, max_upload_bytes=1)
    for scope in ({"type": "lifespan"}, {"type": "websocket", "path": UPLOAD, "headers": []}):
        await guard(scope, receive, send)
        assert calls[-1] == (scope, receive, send)


@pytest.mark.asyncio
async def test_no_second_response_when_the_app_answered_before_reading() -> None:
    async def eager_app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        while (await receive()).get("more_body"):
            pass
        await send({"type": "http.response.body", "body": b"done"})

    chunks = [{"type": "http.request", "body": b"x" * 600, "more_body": True} for _ in range(3)]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return chunks.pop(0)

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": UPLOAD, "headers": []}
    await UploadSizeGuard(eager_app, max_upload_bytes=1000)(scope, receive, send)
    assert [message["type"] for message in sent] == ["http.response.start"]
    assert sent[0]["status"] == 200
    assert len(chunks) == 1, "the guard stopped reading at the chunk past the limit"


@pytest.mark.asyncio
async def test_after_the_limit_the_app_reads_a_disconnect_not_more_body() -> None:
    seen: list[str] = []

    async def stubborn_app(scope: Any, receive: Any, send: Any) -> None:
        try:
            while (await receive()).get("more_body"):
                pass
        except Exception as error:  # the guard's signal; this app keeps reading anyway
            seen.append(type(error).__name__)
        seen.append((await receive())["type"])
        await send({"type": "http.response.start", "status": 400, "headers": []})
        await send({"type": "http.response.body", "body": b"bad"})

    chunks = [{"type": "http.request", "body": b"x" * 600, "more_body": True} for _ in range(5)]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return chunks.pop(0)

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": UPLOAD, "headers": []}
    await UploadSizeGuard(stubborn_app, max_upload_bytes=1000, linger_seconds=0)(scope, receive, send)
    assert seen == ["UploadTooLargeError", "http.disconnect"]
    assert len(chunks) == 3, "no chunk was read past the one that crossed the limit"
    assert [message["type"] for message in sent] == ["http.response.start", "http.response.body"]
    assert sent[0]["status"] == 413


@pytest.mark.asyncio
async def test_an_upload_waits_for_its_page_to_connect_and_no_longer_than_the_bound() -> None:
    recorder, connected = Recorder(), set()
    waiting = UploadWaitsForSession(recorder.app, connected.__contains__, wait_seconds=0.6)
    async with client_for(waiting) as client:
        early = asyncio.create_task(client.post(UPLOAD, params={"session_id": "page-1"}, content=b"a"))
        await asyncio.sleep(0.2)
        assert recorder.handler_calls == 0, "held until the page's socket connects"
        connected.add("page-1")
        assert (await early).status_code == 200
        started = time.monotonic()
        never = await client.post(UPLOAD, params={"session_id": "no-such-page"}, content=b"b")
        waited = time.monotonic() - started
        unnamed = await client.post(UPLOAD, content=b"c")  # nothing to wait for
        other = await client.post("/other", params={"session_id": "no-such-page"}, content=b"d")
    # At most its bound and a little (0.98 s here with a core busy elsewhere), then Chainlit's route.
    assert never.status_code == 200 and 0.5 <= waited < 5, "then Chainlit's route answers it"
    assert unnamed.status_code == other.status_code == 200 and recorder.handler_calls == 4


def test_limit_message_names_the_size() -> None:
    assert too_large_detail(20 * MIB) == "File too large: limit is 20 MB."
    assert too_large_detail(MIB + MIB // 2) == "File too large: limit is 1.5 MB."
    assert too_large_detail(512) == "File too large: limit is 512 bytes."
    with pytest.raises(ValueError):
        UploadSizeGuard(lambda *args: None, max_upload_bytes=0)  # type: ignore[arg-type]
