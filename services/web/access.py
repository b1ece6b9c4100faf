"""Who is asking, on the HTTP side: the client address for sign-in, removed accounts, feedback ownership.

- `SignInRequestMiddleware` hands each request's TCP peer, client address (services/web/peers.py)
  and device cookie to the sign-in callbacks (Chainlit passes them only the form or the headers),
  sends their refusal (429 with Retry-After, 503) in place of the plain 401 Chainlit makes of any
  failed sign-in, and a new device cookie with a good one (services/accounts/devices.py);
- ended sign-ins (signed out, a new password or role, a removed account, past their lifetime) are
  refused on every HTTP route and at the socket's connect (services/web/sign_in_sessions.py);
- Chainlit 2.12's feedback routes do not check whose message the feedback is about: the routes
  put in front of them do (and bound the comment, stored_text.py), then hand over to Chainlit's own;
- Chainlit 2.12 serves its share routes (`PUT /project/thread/share` marks a conversation shared,
  `GET /project/share/{id}` shows a shared one to anyone) whatever `allow_thread_sharing` says:
  while it is false, routes in front of them answer 404.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from chainlit import server as chainlit_server
from chainlit.auth import get_current_user
from chainlit.config import config as chainlit_config
from chainlit.types import DeleteFeedbackRequest, UpdateFeedbackRequest
from fastapi import Depends, FastAPI, HTTPException, Request
from starlette.requests import cookie_parser

from services.accounts.devices import COOKIE_NAME as DEVICE_COOKIE
from services.accounts.sign_in import SignInRequest, current_request
from services.history import conversations
from services.runtime import Runtime
from services.web.peers import peer_of
from services.web.routes import move_to_front
from services.web.sign_in_sessions import install_session_guards
from services.web.stored_text import check_feedback_comment

ASGIApp = Callable[[MutableMapping[str, Any], Callable, Callable], Awaitable[None]]


class SignInRequestMiddleware:
    """Sets `current_request` for each HTTP request; turns a 401 into the callback's refusal (pure ASGI)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: MutableMapping[str, Any], receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        device_cookie = _cookie(scope, DEVICE_COOKIE)
        request = SignInRequest(
            (scope.get("client") or (None,))[0], peer_of(scope), device_cookie=device_cookie
        )
        token = current_request.set(request)
        replaced = False

        async def send_or_refuse(message: MutableMapping[str, Any]) -> None:
            nonlocal replaced
            starts = message["type"] == "http.response.start"
            if starts and message["status"] == 401 and request.refusal:
                replaced = True
                await _send_refusal(send, *request.refusal)
            elif not replaced:
                if starts and message["status"] == 200 and request.set_device_cookie:
                    added = (b"set-cookie", request.set_device_cookie.encode("latin-1"))
                    message = {**message, "headers": [*message.get("headers", ()), added]}
                await send(message)

        try:
            await self.app(scope, receive, send_or_refuse)
        finally:
            current_request.reset(token)


def _cookie(scope: MutableMapping[str, Any], name: str) -> str | None:
    """One cookie of an ASGI request, as Starlette reads cookies."""
    for key, value in scope.get("headers") or ():
        if key == b"cookie":
            return cookie_parser(value.decode("latin-1")).get(name)
    return None


async def _send_refusal(send: Callable, status: int, detail: str, retry_after_seconds: int | None) -> None:
    body = json.dumps({"detail": detail}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if retry_after_seconds is not None:
        headers.append((b"retry-after", str(retry_after_seconds).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def install_access_guards(app: FastAPI, runtime: Runtime) -> None:
    """Client addresses, ended sign-ins refused, feedback only on one's own messages, no sharing
    unless `allow_thread_sharing`."""
    app.add_middleware(SignInRequestMiddleware)
    install_session_guards(app, runtime)
    _guard_feedback(app, runtime)
    if not chainlit_config.features.allow_thread_sharing:
        _refuse_sharing(app)


def _guard_feedback(app: FastAPI, runtime: Runtime) -> None:
    signed_in = Depends(get_current_user)  # a default value: FastAPI cannot resolve a local alias here

    async def owner_check(user: Any, step_id: str | None, feedback_id: str | None) -> None:
        history = runtime.history
        if history is None or history.engine is None or user is None:
            raise HTTPException(401, "Unauthorized")
        try:
            if feedback_id:
                exists, owner = await conversations.owner_of_feedback(history.engine, feedback_id)
                if exists and owner != user.identifier:
                    raise HTTPException(404, "Feedback not found")
            if (
                step_id is not None
                and await conversations.owner_of_step(history.engine, step_id) != user.identifier
            ):
                raise HTTPException(404, "Message not found")
        except HTTPException:
            raise
        except Exception as error:
            history.health.failed(error)
            raise HTTPException(
                503, "Feedback cannot be saved right now: chat history is unavailable."
            ) from None

    async def update_feedback(request: Request, update: UpdateFeedbackRequest, user: Any = signed_in) -> Any:
        check_feedback_comment(update.feedback.comment, runtime.settings)
        await owner_check(user, update.feedback.forId, update.feedback.id)
        return await chainlit_server.update_feedback(request, update, user)

    async def delete_feedback(request: Request, payload: DeleteFeedbackRequest, user: Any = signed_in) -> Any:
        await owner_check(user, None, payload.feedbackId)
        return await chainlit_server.delete_feedback(request, payload, user)

    before = len(app.router.routes)
    app.add_api_route("/feedback", update_feedback, methods=["PUT"], include_in_schema=False)
    app.add_api_route("/feedback", delete_feedback, methods=["DELETE"], include_in_schema=False)
    move_to_front(app, app.router.routes[before:])


def _refuse_sharing(app: FastAPI) -> None:
    async def not_found() -> None:
        raise HTTPException(404, "Not Found")

    before = len(app.router.routes)
    app.add_api_route("/project/thread/share", not_found, methods=["PUT"], include_in_schema=False)
    app.add_api_route("/project/share/{thread_id}", not_found, methods=["GET"], include_in_schema=False)
    move_to_front(app, app.router.routes[before:])
