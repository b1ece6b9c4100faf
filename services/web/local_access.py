"""Local mode at the edge: every route and the socket answer only a browser on this machine.

The rules are services/accounts/local.py's. In local mode this middleware refuses (403, or a
refused socket) any request whose TCP peer is not loopback; but for /v1 (every API request carries
a key, which browsers never add on their own) also any request whose Origin is another page than
the one it asks, and any request under a Host that is not a loopback name unless it is already
signed in (a valid sign-in cookie, which a page under another name cannot have: cookies belong to
the name they were set for) or goes to the token route. So a page under the attacker's name (DNS
rebinding) gets nothing, not even the page itself.

The token route, GET /auth/local?token=<the install's token>, signs in anyone who has the token,
under any name (a tunnel, a proxy, another host name), and sends them to the chat.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from chainlit import server as chainlit_server
from chainlit.auth.cookie import get_token_from_cookies
from chainlit.auth.jwt import decode_jwt
from fastapi import FastAPI, HTTPException, Request, Response
from starlette.requests import cookie_parser

from services.accounts import local
from services.accounts.sign_in import SignIn
from services.web.peers import peer_of
from services.web.routes import move_to_front

logger = logging.getLogger(__name__)

ASGIApp = Callable[[MutableMapping[str, Any], Callable, Callable], Awaitable[None]]
API_PREFIX = "/v1"


def signed_in(headers: dict[str, str]) -> bool:
    """Whether the request carries a valid sign-in token (Chainlit's cookie, or its bearer fallback)."""
    token = get_token_from_cookies(cookie_parser(headers.get("cookie", "")))
    scheme, _, bearer = headers.get("authorization", "").partition(" ")
    token = token or (bearer.strip() if scheme.lower() == "bearer" else None)
    if not token:
        return False
    try:
        decode_jwt(token)
    except Exception:
        return False
    return True


def refusal(scope: MutableMapping[str, Any], headers: dict[str, str]) -> str | None:
    """Why local mode refuses this request, or None."""
    path = scope.get("path", "")
    if problem := local.peer_problem(peer_of(scope)):
        return problem
    if path == API_PREFIX or path.startswith(API_PREFIX + "/"):
        return None  # a key in every request, never sent by a browser on its own
    if problem := local.origin_problem(headers):
        return problem
    if path != local.TOKEN_PATH and (problem := local.host_problem(headers)) and not signed_in(headers):
        return problem
    return None


class LocalOnly:
    """Answers only this machine's browser, the signed in, the token route and the API (pure ASGI)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: MutableMapping[str, Any], receive: Callable, send: Callable) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers: dict[str, str] = {}
        for name, value in scope.get("headers", ()):  # the first of repeated headers, as Starlette reads
            headers.setdefault(name.decode("latin-1"), value.decode("latin-1"))
        if (problem := refusal(scope, headers)) is None:
            await self.app(scope, receive, send)
            return
        logger.warning("local mode refused %s %s: %s", scope["type"], scope.get("path", "")[:200], problem)
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        body = json.dumps(
            {
                "detail": f"Refused: {problem}. This app serves only a browser on this machine "
                "(http://127.0.0.1 or http://localhost); from elsewhere, sign in "
                "with the token printed at start."
            }
        ).encode()
        response_headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ]
        await send({"type": "http.response.start", "status": 403, "headers": response_headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})


def install_local_access(app: FastAPI, sign_in: SignIn) -> None:
    """Local mode only: the edge check on every request, and the token route."""
    if sign_in.mode != "local":
        return

    async def sign_in_with_token(request: Request, token: str = "") -> Response:
        user = sign_in.local_user_for_token(token)
        if user is None:
            logger.warning("local sign-in with a wrong token from %s", request.headers.get("host", "")[:100])
            raise HTTPException(403, "That is not this install's token.")
        # Chainlit's own sign-in response: the user stored, the cookie set, off to the chat.
        return await chainlit_server._authenticate_user(request, user, redirect_to_callback=True)

    before = len(app.router.routes)
    app.add_api_route(local.TOKEN_PATH, sign_in_with_token, methods=["GET"], include_in_schema=False)
    move_to_front(app, app.router.routes[before:])
    app.add_middleware(LocalOnly)
