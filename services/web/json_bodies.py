"""Request bodies of Chainlit's own routes, checked before Chainlit parses them: as JSON at most
MAX_JSON_DEPTH levels deep (400); their size is bounded outside, by body_limit.py (413).

Chainlit 2.12 reads whole bodies into memory with no size bound and parses them with no depth
bound. Its HTTP routes already answer 400 to a body nested past Python's recursion limit (FastAPI
turns the parser's RecursionError into 400; `/set-session-cookie`, which calls `request.json()`
itself, is behind services/web/client_ids.py), but a body deep enough to pass the parser still
reaches pydantic and the data layer. Every body that is not a form or an upload is read here first,
bounded, and checked. The API (/v1) checks its own bodies (services/api/checks.py).
The socket's messages are JSON too: python-socketio decodes them unbounded, and a RecursionError
there is logged with a traceback per message. Its packets are decoded with the same depth bound, and
a packet nested deeper is dropped with a one-line warning.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from chainlit.server import SOCKET_IO_PATH, sio
from engineio import json as engineio_json

from services.api.checks import JsonTooDeep, parse_json
from services.api.gate import replay

logger = logging.getLogger(__name__)

ASGIApp = Callable[[MutableMapping[str, Any], Callable, Callable], Awaitable[None]]

FORM_TYPES = (b"multipart/form-data", b"application/x-www-form-urlencoded")  # parsed as forms, not JSON
BODY_METHODS = ("POST", "PUT", "PATCH", "DELETE")


class JsonBodyGuard:
    """Refuses an oversized body (413) or one nested too deeply (400) before Chainlit reads it (pure ASGI)."""

    def __init__(self, app: ASGIApp, max_body_bytes: int, max_depth: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.max_depth = max_depth

    async def __call__(self, scope: MutableMapping[str, Any], receive: Callable, send: Callable) -> None:
        if scope["type"] != "http" or not self.checks(scope):
            await self.app(scope, receive, send)
            return
        body = await read_limited(receive, self.max_body_bytes)
        if body is None:
            await send_detail(send, 413, f"The request body is larger than {self.max_body_bytes:,} bytes.")
            return
        try:
            parse_json(body, self.max_depth)
        except JsonTooDeep as error:
            await send_detail(send, 400, f"The request body is {error}.")
            return
        except ValueError:
            pass  # not JSON: the route answers as it would
        await self.app(scope, replay(body, receive), send)

    @staticmethod
    def checks(scope: MutableMapping[str, Any]) -> bool:
        """True for a request with a body to Chainlit's routes, unless it is a form (uploads are forms)."""
        path = scope.get("path", "")
        if scope.get("method") not in BODY_METHODS or path == "/v1":
            return False
        if path.startswith(("/v1/", SOCKET_IO_PATH)):
            return False
        content_type = dict(scope.get("headers", ())).get(b"content-type", b"").lower()
        return not content_type.startswith(FORM_TYPES)


async def read_limited(receive: Callable, limit: int) -> bytes | None:
    """The whole request body; None when it passes `limit` (or the client leaves)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def send_detail(send: Callable, status: int, detail: str) -> None:
    body = json.dumps({"detail": detail}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


class BoundedJson:
    """socket.io's JSON module (engine.io's: integers of at most 100 digits), with the depth bound."""

    def __init__(self, max_depth: int) -> None:
        self.max_depth = max_depth

    def loads(self, text: str | bytes, **options: Any) -> Any:
        return parse_json(text, self.max_depth, lambda body: engineio_json.loads(body, **options))

    dumps = staticmethod(engineio_json.dumps)


def bound_socket_messages(max_depth: int) -> None:
    """Decode the socket's packets with the depth bound; drop (and warn of) one nested deeper."""
    if isinstance(getattr(sio.packet_class, "json", None), BoundedJson):
        return
    sio.packet_class = type("BoundedPacket", (sio.packet_class,), {"json": BoundedJson(max_depth)})
    handle_message = sio.eio.handlers["message"]

    async def handle_bounded(eio_sid: str, data: Any) -> Any:
        try:
            return await handle_message(eio_sid, data)
        except JsonTooDeep as error:
            logger.warning("socket message dropped: it is %s", error)
            return None

    sio.eio.handlers["message"] = handle_bounded
