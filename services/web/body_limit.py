"""Every HTTP request body has a size bound, checked before the body is read (pure ASGI middleware).

Chainlit's routes read a JSON body whole (FastAPI, pydantic) and store what it holds: a 20 MB thread
name or feedback comment was kept as sent. `BodyLimit` sits outside every other middleware and answers
413 with a JSON detail to a body over its route's limit: by the Content-Length header before any of
it is read, and by counting the bytes of a body sent without one, cut off at the first chunk past the
limit. The limit of a request comes from `limit_for`; None leaves the request to a guard of its own
(the upload route: UploadSizeGuard and MAX_UPLOAD_BYTES; the /v1 API: ApiGate and API_MAX_BODY_BYTES,
which answer in their own shapes).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

logger = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class BodyTooLargeError(Exception):
    """Raised inside `receive` once a streamed body passes its limit."""


def declared_length(scope: Scope) -> int | None:
    """The Content-Length of a request; None when absent or unparsable (the bytes are counted anyway)."""
    values = [value for name, value in scope.get("headers", ()) if name.lower() == b"content-length"]
    try:
        return max(int(value) for value in values) if values else None
    except ValueError:
        return None


def too_large_detail(limit_bytes: int) -> str:
    return f"The request body is larger than {limit_bytes:,} bytes, this service's limit for this route."


class BodyLimit:
    """413 for a body over `limit_for(scope)` bytes; the rest of the body is read and dropped for up
    to `linger_seconds` first, so a client still sending reads the 413 instead of a reset."""

    def __init__(
        self, app: ASGIApp, limit_for: Callable[[Scope], int | None], linger_seconds: float = 5.0
    ) -> None:
        self.app = app
        self.limit_for = limit_for
        self.linger_seconds = linger_seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        limit = self.limit_for(scope) if scope["type"] == "http" else None
        if limit is None:
            await self.app(scope, receive, send)
            return
        declared = declared_length(scope)
        if declared is not None and declared > limit:
            logger.info(
                "%s %s refused: Content-Length %d > %d",
                scope.get("method"),
                scope.get("path"),
                declared,
                limit,
            )
            await self._refuse(receive, send, limit)
            return
        await self._counted(scope, receive, send, limit)

    async def _counted(self, scope: Scope, receive: Receive, send: Send, limit: int) -> None:
        body = _CountedBody(receive, send, limit, self._refuse)
        try:
            await self.app(scope, body.receive, body.send)
        except Exception:
            if not body.too_large:
                raise
            if not body.started:
                await self._refuse(receive, send, limit)
        if body.too_large:
            logger.info(
                "%s %s refused: streamed body passed %d bytes", scope.get("method"), scope.get("path"), limit
            )

    async def _refuse(self, receive: Receive, send: Send, limit: int) -> None:
        if self.linger_seconds > 0:
            with contextlib.suppress(TimeoutError, BodyTooLargeError):
                async with asyncio.timeout(self.linger_seconds):
                    while True:
                        message = await receive()
                        if message["type"] != "http.request" or not message.get("more_body", False):
                            break
        body = json.dumps({"detail": too_large_detail(limit)}).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})


class _CountedBody:
    """`receive` and `send` of one request whose body is counted as the app reads it."""

    def __init__(
        self,
        receive: Receive,
        send: Send,
        limit: int,
        refuse: Callable[[Receive, Send, int], Awaitable[None]],
    ) -> None:
        self._receive = receive
        self._send = send
        self.limit = limit
        self._refuse = refuse
        self.received = 0
        self.too_large = False
        self.started = False  # the app's response has begun
        self.replaced = False  # our 413 went out in place of the app's response

    async def receive(self) -> Message:
        if self.too_large:  # asked again after the error: the body is over
            return {"type": "http.disconnect"}
        message = await self._receive()
        if message["type"] == "http.request":
            self.received += len(message.get("body", b""))
            if self.received > self.limit:
                self.too_large = True
                raise BodyTooLargeError(f"body passed {self.limit} bytes")
        return message

    async def send(self, message: Message) -> None:
        if self.replaced:
            return  # the rest of the app's response, already replaced by our 413
        if message["type"] == "http.response.start":
            self.started = True
            if self.too_large:  # the app made an error of its own (400, 422) of ours: 413 instead
                self.replaced = True
                await self._refuse(self._receive, self._send, self.limit)
                return
        await self._send(message)


def route_path(scope: Scope) -> str:
    """The request's path inside the app (without a --root-path prefix)."""
    path = scope.get("path", "")
    root = scope.get("root_path", "")
    return path[len(root) :] if root and path.startswith(root) else path


def limits_by_route(
    default_bytes: int, socket_bytes: int, upload_path: str, api_served: bool
) -> Callable[[Scope], int | None]:
    """Which limit a request gets: the socket.io polling transport `socket_bytes` (one event, as
    engine.io's own max_http_buffer_size), the upload and (when served) the API their own guards,
    everything else `default_bytes`."""

    def limit_for(scope: Scope) -> int | None:
        path = route_path(scope)
        if path.startswith("/ws/socket.io"):
            return socket_bytes
        if path == upload_path and scope.get("method") == "POST":
            return None  # UploadSizeGuard: MAX_UPLOAD_BYTES, and it tells the uploader's chat
        if api_served and (path == "/v1" or path.startswith("/v1/")):
            return None  # ApiGate: API_MAX_BODY_BYTES, in OpenAI's error shape
        return default_bytes

    return limit_for


def install_body_limit(app: Any, limit_for: Callable[[Scope], int | None], linger_seconds: float) -> None:
    """Put `BodyLimit` in front of `app` (call after the other middleware: the last added is outermost)."""
    app.add_middleware(BodyLimit, limit_for=limit_for, linger_seconds=linger_seconds)
