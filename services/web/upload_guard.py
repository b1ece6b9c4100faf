"""Guards in front of Chainlit's upload route (pure ASGI middleware).

- Oversized uploads are refused before they are read into memory: Chainlit
  2.12's route (POST /project/file) reads the whole file before it checks the
  size, so the limit is enforced here, by the Content-Length header when there
  is one, and by counting streamed body bytes.
- An upload that names a page whose socket has not connected yet waits (a
  bounded time) for it: a file dropped in the page's first moment is posted
  before its session exists, and Chainlit would answer "Session not found".
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import parse_qs

from services.web.body_limit import declared_length

logger = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

DEFAULT_UPLOAD_PATH = "/project/file"  # Chainlit's upload route
# After refusing an upload, how long its unread rest is read and discarded: long enough for a client
# still sending to see the refusal instead of a connection reset.
UPLOAD_LINGER_SECONDS = 5.0
UPLOAD_SESSION_WAIT_SECONDS = 10.0  # an upload waits for its page's connection (a file dropped as it opens)
SESSION_POLL_SECONDS = 0.05
EMPTY_UPLOAD_DETAIL = "The file is empty; please upload a file with some text in it."


class UploadTooLargeError(Exception):
    """Raised inside `receive` once a streamed body passes the limit."""


def too_large_detail(max_upload_bytes: int) -> str:
    """The sentence the user sees when an upload is over the limit."""
    if max_upload_bytes >= 1024 * 1024:
        size = f"{max_upload_bytes / (1024 * 1024):.1f}".removesuffix(".0") + " MB"
    elif max_upload_bytes >= 1024:
        size = f"{max_upload_bytes / 1024:.1f}".removesuffix(".0") + " KB"
    else:
        size = f"{max_upload_bytes} bytes"
    return f"File too large: limit is {size}."


class UploadSizeGuard:
    """Answers 413 to POSTs on `path` whose body exceeds `max_upload_bytes`; all else passes.

    The body is never buffered: a large Content-Length is refused before the app
    reads any of it, and a streamed body is cut off at the first chunk past the
    limit. Before the 413 goes out, the rest of the body is read and thrown away
    for up to `linger_seconds` (a "lingering close"): a client still sending when
    the server closes gets a connection reset instead of the 413, and browsers then
    show a network error.
    """

    def __init__(
        self,
        app: ASGIApp,
        max_upload_bytes: int,
        path: str = DEFAULT_UPLOAD_PATH,
        on_reject: Callable[[Scope, str], Awaitable[None]] | None = None,
        linger_seconds: float = UPLOAD_LINGER_SECONDS,
    ) -> None:
        if max_upload_bytes < 1:
            raise ValueError("max_upload_bytes must be at least 1")
        self.app = app
        self.max_upload_bytes = max_upload_bytes
        self.linger_seconds = linger_seconds
        self.path = path
        self.on_reject = on_reject  # e.g. tell the uploader's chat session

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not is_post_on(scope, self.path):
            await self.app(scope, receive, send)
            return
        declared = declared_length(scope)
        if declared is not None and declared > self.max_upload_bytes:
            logger.info("upload refused: Content-Length %d > %d bytes", declared, self.max_upload_bytes)
            await self._refuse_too_large(receive, send)
            await self._notify(scope)
            return
        await self._guarded_call(scope, receive, send)

    async def _guarded_call(self, scope: Scope, receive: Receive, send: Send) -> None:
        received_bytes = 0
        too_large = False
        response_started = False
        replaced = False  # our 413 went out instead of the app's response

        async def counting_receive() -> Message:
            nonlocal received_bytes, too_large
            if too_large:  # the app asks again after the error: the body is over
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received_bytes += len(message.get("body", b""))
                if received_bytes > self.max_upload_bytes:
                    too_large = True
                    raise UploadTooLargeError(f"body passed {self.max_upload_bytes} bytes")
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal response_started, replaced
            if replaced:
                return  # the rest of the app's response, already replaced by our 413
            if message["type"] == "http.response.start":
                response_started = True
                if too_large:
                    # The app turned our error into a response of its own (FastAPI says
                    # 400 "error parsing the body"): answer 413 instead.
                    replaced = True
                    await self._refuse_too_large(receive, send)
                    return
            await send(message)

        try:
            await self.app(scope, counting_receive, tracking_send)
        except ValueError as error:
            # Chainlit 2.12 answers an empty file with a 500 ("Either path or content
            # must be provided to persist a file"): say what happened instead.
            if too_large or response_started or "must be provided to persist" not in str(error):
                raise
            await self._reject(send, status=400, detail=EMPTY_UPLOAD_DETAIL)
            await self._notify(scope, EMPTY_UPLOAD_DETAIL)
            return
        except Exception:
            if not too_large:
                raise
            if response_started:
                if not replaced:
                    logger.warning("upload passed the limit after the response started; dropped")
                return
            await self._refuse_too_large(receive, send)
        if too_large:
            logger.info("upload refused: streamed body passed %d bytes", self.max_upload_bytes)
            await self._notify(scope)

    async def _notify(self, scope: Scope, detail: str | None = None) -> None:
        if self.on_reject is None:
            return
        try:
            await self.on_reject(scope, detail or too_large_detail(self.max_upload_bytes))
        except Exception:  # telling the user is best effort; the 413 already went out
            logger.exception("upload refusal notice failed")

    async def _refuse_too_large(self, receive: Receive, send: Send) -> None:
        """Drop what is left of the body (for at most `linger_seconds`), then answer 413."""
        await refuse_unread(receive, send, 413, too_large_detail(self.max_upload_bytes), self.linger_seconds)

    async def _reject(self, send: Send, status: int = 413, detail: str | None = None) -> None:
        await answer_detail(send, status, detail or too_large_detail(self.max_upload_bytes))


async def refuse_unread(
    receive: Receive, send: Send, status: int, detail: str, linger_seconds: float
) -> None:
    """Refuse an upload whose body is still coming: read and drop its rest for at most `linger_seconds`
    (a "lingering close": a client still sending when the server closes gets a connection reset, and
    browsers then show a network error instead of `detail`), then answer."""
    if linger_seconds > 0:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(linger_seconds):
                while True:
                    message = await receive()
                    if message["type"] != "http.request" or not message.get("more_body", False):
                        break
    await answer_detail(send, status, detail)


async def answer_detail(send: Send, status: int, detail: str) -> None:
    """A JSON `{"detail": ...}` answer, which Chainlit's page shows after "Failed to upload <name>:"."""
    body = json.dumps({"detail": detail}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),  # the unread rest of the body stays on the wire
            ],
        }
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})


class UploadWaitsForSession:
    """Holds a POST on `path` whose `session_id` is not (yet) a connected page, for at most
    `wait_seconds`; then Chainlit's route answers it either way."""

    def __init__(
        self,
        app: ASGIApp,
        session_exists: Callable[[str], bool],
        wait_seconds: float = UPLOAD_SESSION_WAIT_SECONDS,
        path: str = DEFAULT_UPLOAD_PATH,
    ) -> None:
        self.app = app
        self.session_exists = session_exists
        self.wait_seconds = wait_seconds
        self.path = path

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if is_post_on(scope, self.path):
            session_id = upload_session_id(scope)
            deadline = time.monotonic() + self.wait_seconds
            while session_id and not self.session_exists(session_id) and time.monotonic() < deadline:
                await asyncio.sleep(SESSION_POLL_SECONDS)
        await self.app(scope, receive, send)


def upload_session_id(scope: Scope) -> str:
    """The chat an upload names (`?session_id=`), or "" when it names none."""
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    return (query.get("session_id") or [""])[0]


def is_post_on(scope: Scope, path: str) -> bool:
    if scope["type"] != "http" or scope.get("method") != "POST":
        return False
    return scope.get("path", "") in (path, scope.get("root_path", "") + path)


def install_upload_guard(
    fastapi_app: Any,
    max_upload_bytes: int,
    path: str = DEFAULT_UPLOAD_PATH,
    on_reject: Callable[[Scope, str], Awaitable[None]] | None = None,
    linger_seconds: float = UPLOAD_LINGER_SECONDS,
    session_exists: Callable[[str], bool] | None = None,
    session_wait_seconds: float = UPLOAD_SESSION_WAIT_SECONDS,
) -> None:
    """Put the guards in front of `fastapi_app` (call at import time, before it starts): the size
    guard first, so an oversized upload is refused at once, then (given `session_exists`) the wait
    for the page's session."""
    if session_exists is not None:
        fastapi_app.add_middleware(
            UploadWaitsForSession, session_exists=session_exists, wait_seconds=session_wait_seconds, path=path
        )
    fastapi_app.add_middleware(
        UploadSizeGuard,
        max_upload_bytes=max_upload_bytes,
        path=path,
        on_reject=on_reject,
        linger_seconds=linger_seconds,
    )
