"""Ids a client chooses, checked at our edge before Chainlit builds anything from them.

Chainlit 2.12 takes the socket's `auth.sessionId` unchecked and makes it a folder,
`FILES_DIRECTORY / session_id`: an absolute id replaces the base folder, and `clear_session` and
the session's end then `rmtree` it (SECURITY.md, known upstream issues). So:
- the socket's connect handler is wrapped: the session id must be a UUID, the thread id empty or a
  UUID, the client type the page's own, the chat profile and user env short; anything else is
  refused before Chainlit sees it;
- every HTTP request that names a session must name a UUID (400 otherwise): `session_id` in the
  query (uploads and file downloads) and in the JSON body of Chainlit's element, action and
  session-cookie routes;
- a session's folder must resolve to a direct child of FILES_DIRECTORY, whatever made its id.
"""

from __future__ import annotations

import inspect
import json
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import chainlit.socket  # registers Chainlit's socket handlers, which are wrapped here
from chainlit.config import FILES_DIRECTORY
from chainlit.server import sio
from chainlit.session import BaseSession
from socketio.exceptions import ConnectionRefusedError as SocketRefused

from services.api.gate import replay
from services.history.data_layer import is_uuid
from services.web.json_bodies import read_limited, send_detail

logger = logging.getLogger(__name__)

ASGIApp = Callable[[MutableMapping[str, Any], Callable, Callable], Awaitable[None]]

SOCKET_CLIENT_TYPES = ("webapp", "copilot")  # the others (slack, teams, discord) never use the socket
MAX_CHAT_PROFILE_CHARS = 200
MAX_USER_ENV_CHARS = 4096
# JSON bodies of Chainlit routes that name a session; they are small, so reading one whole is cheap.
BODY_SESSION_FIELDS = {
    ("PUT", "/project/element"): "sessionId",
    ("DELETE", "/project/element"): "sessionId",
    ("POST", "/project/action"): "sessionId",
    ("POST", "/set-session-cookie"): "session_id",
}
MAX_SESSION_BODY_BYTES = 256 * 1024
BAD_SESSION_ID = "The session id must be a UUID."


def handshake_problem(auth: Any) -> str | None:
    """Why a socket's `auth` payload is refused; None when it is what Chainlit's page sends."""
    if not isinstance(auth, dict):
        return "the connection carries no session"
    if not is_uuid(auth.get("sessionId")):
        return "the session id must be a UUID"
    thread_id = auth.get("threadId")
    if thread_id not in (None, "") and not is_uuid(thread_id):
        return "the conversation id must be a UUID"
    if auth.get("clientType") not in SOCKET_CLIENT_TYPES:
        return "unknown client type"
    profile = auth.get("chatProfile")
    user_env = auth.get("userEnv")
    if profile is not None and (not isinstance(profile, str) or len(profile) > MAX_CHAT_PROFILE_CHARS):
        return "the chat profile is not a short text"
    if user_env is not None and (not isinstance(user_env, str) or len(user_env) > MAX_USER_ENV_CHARS):
        return "the user environment is not a short text"
    if user_env and not isinstance(_json_or_none(user_env), dict):
        return "the user environment is not a JSON object"  # Chainlit parses it unchecked
    return None


def _json_or_none(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def guard_socket_connect() -> None:
    """Wrap Chainlit's socket.io connect handler with `handshake_problem` (once)."""
    handlers = sio.handlers["/"]
    chainlit_connect = handlers["connect"]
    if getattr(chainlit_connect, "checks_client_ids", False):
        return

    async def connect(sid: str, environ: dict[str, Any], auth: Any = None) -> Any:
        if problem := handshake_problem(auth):
            logger.warning("socket connect refused: %s", problem)
            raise SocketRefused(problem)
        return await chainlit_connect(sid, environ, auth)

    connect.checks_client_ids = True  # type: ignore[attr-defined]
    connect.__wrapped__ = chainlit_connect  # type: ignore[attr-defined]
    handlers["connect"] = connect
    assert inspect.unwrap(chainlit_connect) is chainlit.socket.connect, "Chainlit's connect handler moved"


def session_folder(session: BaseSession) -> Path:
    """Chainlit's `files_dir`, refused unless it is a direct child of FILES_DIRECTORY."""
    base = FILES_DIRECTORY.resolve()
    folder = (base / str(session.id)).resolve()
    if not is_uuid(session.id) or folder.parent != base:
        raise PermissionError(f"refused a session folder outside {base}")
    return folder


class SessionIdGuard:
    """Answers 400 to an HTTP request that names a session by anything but a UUID (pure ASGI)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: MutableMapping[str, Any], receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        if any(not is_uuid(value) for value in query.get("session_id", ())):
            await send_detail(send, 400, BAD_SESSION_ID)
            return
        field = BODY_SESSION_FIELDS.get((scope.get("method", ""), _route_path(scope)))
        if field is None:
            await self.app(scope, receive, send)
            return
        body = await read_limited(receive, MAX_SESSION_BODY_BYTES)
        if body is None or not is_uuid(_json_field(body, field)):
            await send_detail(send, 400, BAD_SESSION_ID)
            return
        await self.app(scope, replay(body, receive), send)


def _route_path(scope: MutableMapping[str, Any]) -> str:
    path = scope.get("path", "")
    root = scope.get("root_path", "")
    return path[len(root) :] if root and path.startswith(root) else path


def _json_field(body: bytes, field: str) -> Any:
    try:
        payload = json.loads(body)
    except (ValueError, RecursionError):
        return None
    return payload.get(field) if isinstance(payload, dict) else None


def install_client_id_guards(app: Any) -> None:
    """Check client-chosen session ids on the socket and on HTTP; call after the routes and guards
    that read requests, so the HTTP guard wraps them (only the edge's body bound and headers wrap it)."""
    guard_socket_connect()
    BaseSession.files_dir = property(session_folder)  # type: ignore[assignment,method-assign]
    app.add_middleware(SessionIdGuard)
