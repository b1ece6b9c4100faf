"""HTTP requests that Chainlit 2.12 answered with a 500 and a traceback, answered cleanly here.

- FastAPI answers a body that fails validation with each error's `input`: the body as it came. A
  body that is not UTF-8, or JSON text with a lone surrogate (`"\\ud800"`), could not be encoded
  into that answer. Here the answer names where and why, never the input, and escapes whatever it
  does repeat (a field name): 422, as FastAPI means it.
- The routes that serve files by the name in the path (/public, /assets, /copilot, our /vendor)
  hand it to the file system as it is: a name longer than a file name can be (ENAMETOOLONG) or one
  with a NUL byte raised. No file has such a name: 404.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response

ASGIApp = Callable[[MutableMapping[str, Any], Callable, Callable], Awaitable[None]]

FILE_ROUTES = ("/public/", "/assets/", "/copilot/", "/vendor/")
NAME_MAX_BYTES = 255  # the longest file name Linux file systems take
PATH_MAX_BYTES = 4096


async def validation_error(request: Request, error: Exception) -> Response:
    """422 with each error's location, message and type (FastAPI's shape, without `input`)."""
    errors = error.errors() if isinstance(error, RequestValidationError) else []
    detail = [
        {"loc": list(e.get("loc", ())), "msg": e.get("msg", ""), "type": e.get("type", "")} for e in errors
    ]
    body = json.dumps({"detail": detail}, ensure_ascii=True, default=str)
    return Response(body, status_code=422, media_type="application/json")


def impossible_file_name(path: str) -> bool:
    """True for a path no file can have: a NUL byte, a part or the whole too long."""
    encoded = path.encode("utf-8", "surrogatepass")
    return (
        b"\x00" in encoded
        or len(encoded) > PATH_MAX_BYTES
        or any(len(part) > NAME_MAX_BYTES for part in encoded.split(b"/"))
    )


class FileNameGuard:
    """404 for a file route whose name no file can have, before the route touches the disk."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: MutableMapping[str, Any], receive: Callable, send: Callable) -> None:
        path = scope.get("path", "")
        root = scope.get("root_path", "")
        path = path[len(root) :] if root and path.startswith(root) else path
        if scope["type"] == "http" and path.startswith(FILE_ROUTES) and impossible_file_name(path):
            body = json.dumps({"detail": "File not found"}).encode()
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
            await send({"type": "http.response.start", "status": 404, "headers": headers})
            await send({"type": "http.response.body", "body": body, "more_body": False})
            return
        await self.app(scope, receive, send)


def install_http_errors(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_middleware(FileNameGuard)
