"""Sign-ins that end, at every door Chainlit opens with its cookie (services/accounts/sessions.py
says when a token is no longer good):

- every HTTP route that needs a user: Chainlit's `get_current_user` dependency is wrapped;
- the socket's connect: Chainlit's connect handler is wrapped; the chat handlers check each message
  against the token the socket last connected with;
- `POST /auth/jwt`, which turns a token into a fresh cookie: only a good token is refreshed, and
  the new one keeps the old one's claim, so its absolute lifetime does not restart;
- `POST /logout` ends every sign-in of the account, not only this cookie: a cookie cannot be
  told apart from a copy of it, the copy is what signing out should stop (a shared computer, a
  stolen cookie), and the app keeps no list of sessions to pick one from;
- the cookie's Max-Age and the token's expiry are SIGN_IN_LIFETIME_SECONDS.
"""

from __future__ import annotations

import logging
from typing import Annotated, Any

from chainlit import server as chainlit_server
from chainlit.auth import get_current_user, get_token_from_cookies, reuseable_oauth
from chainlit.config import config as chainlit_config
from chainlit.server import sio
from chainlit.session import WebsocketSession
from fastapi import Depends, FastAPI, HTTPException, Request, Response
from socketio.exceptions import ConnectionRefusedError as SocketRefused
from starlette.requests import cookie_parser

from services.accounts.sessions import Sessions
from services.runtime import Runtime
from services.web.routes import move_to_front

logger = logging.getLogger(__name__)


def install_session_guards(app: FastAPI, runtime: Runtime) -> None:
    """Refuse ended sign-ins on HTTP, on the socket and at /auth/jwt; sign-out ends them all."""
    if runtime.sign_in is None:
        return
    sessions = runtime.sign_in.sessions
    chainlit_config.project.user_session_timeout = int(runtime.settings.sign_in_lifetime_seconds)
    _refuse_on_http(app, sessions)
    _refuse_on_socket(sessions)
    _guard_sign_in_routes(app, sessions)


def _refuse_on_http(app: FastAPI, sessions: Sessions) -> None:
    async def current_user_if_signed_in(token: Annotated[str | None, Depends(reuseable_oauth)]) -> Any:
        if problem := await sessions.token_problem(token):
            raise HTTPException(401, problem)
        return await get_current_user(token)  # type: ignore[arg-type]

    app.dependency_overrides[get_current_user] = current_user_if_signed_in


def socket_token(environ: dict[str, Any]) -> str | None:
    """The sign-in token of a socket's handshake, read as Chainlit reads it (its cookie)."""
    cookie_header = environ.get("HTTP_COOKIE")
    return get_token_from_cookies(cookie_parser(cookie_header)) if cookie_header else None


def _refuse_on_socket(sessions: Sessions) -> None:
    handlers = sio.handlers["/"]
    inner = handlers["connect"]
    if any(getattr(h, "checks_sessions", False) for h in _chain(inner)):
        return

    async def connect(sid: str, environ: dict[str, Any], auth: Any = None) -> Any:
        token = socket_token(environ)
        if problem := await sessions.token_problem(token):
            logger.info("socket connect refused: %s", problem)
            raise SocketRefused(problem)
        accepted = await inner(sid, environ, auth)
        if token and (session := WebsocketSession.get(sid)) is not None:
            session.token = token  # a page reconnecting after signing in again: its new sign-in counts
        return accepted

    connect.checks_sessions = True  # type: ignore[attr-defined]
    connect.__wrapped__ = inner  # type: ignore[attr-defined]
    handlers["connect"] = connect


def _chain(handler: Any) -> list[Any]:
    chain = [handler]
    while (handler := getattr(handler, "__wrapped__", None)) is not None:
        chain.append(handler)
    return chain


def bearer_token(request: Request) -> str | None:
    """The token of an `Authorization: Bearer <token>` header (how /auth/jwt is given one)."""
    scheme, _, token = (request.headers.get("authorization") or "").partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


def _guard_sign_in_routes(app: FastAPI, sessions: Sessions) -> None:
    async def refresh(request: Request) -> Any:
        if problem := await sessions.token_problem(bearer_token(request)):
            raise HTTPException(401, problem)
        return await chainlit_server.jwt_auth(request)

    async def sign_out(request: Request, response: Response) -> Any:
        await sessions.end(get_token_from_cookies(request.cookies) or bearer_token(request))
        return await chainlit_server.logout(request, response)

    before = len(app.router.routes)
    app.add_api_route("/auth/jwt", refresh, methods=["POST"], include_in_schema=False)
    app.add_api_route("/logout", sign_out, methods=["POST"], include_in_schema=False)
    move_to_front(app, app.router.routes[before:])
