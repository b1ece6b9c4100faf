"""Writes only from the app's own page: a state-changing HTTP request (POST, PUT, PATCH, DELETE) that a
browser sends from another site is refused before any route sees it, Chainlit's routes included.

Chainlit 2.12 checks no Origin on any route, so a page on another site could post a form to /login
with the attacker's name and password and sign its visitor's browser in as the attacker (login CSRF:
the visitor's next messages and uploads went to the attacker's account), or post to /logout,
/auth/header, /auth/jwt, /project/*, /conversations/*. SameSite=lax cookies do not stop that: a
sign-in needs no cookie, and a sibling subdomain is the same site. So one rule for every path, by
default (a route added by an upgrade is covered without being named here); a write passes when:
- its Origin is one the app allows (origins.py: the app's own, and ALLOWED_ORIGINS), or
- it has no Origin and its Sec-Fetch-Site is `same-origin`, or
- it has neither header: not a browser (scripts, the load test, the harness), which sends no
  visitor's cookie by accident (the chat socket's rule, origins.py).
EXEMPT_WRITES names the only paths left out, each with why it cannot act with a visitor's cookie.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any

from services.web.origins import OriginPolicy

logger = logging.getLogger(__name__)

ASGIApp = Callable[[MutableMapping[str, Any], Callable, Callable], Awaitable[None]]
WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# Path (and everything under it) -> why a write there cannot act with a visitor's cookie.
EXEMPT_WRITES: dict[str, str] = {
    "/v1": "the API: every request is authorized by the API key in its Authorization header, which "
    "a browser never adds on its own, and the API reads no cookie (services/api/gate.py)",
}
REFUSED = (
    "Refused: this request was not sent from this app's own page. If you opened the app under another "
    "address, open it at its own; an operator can list other origins in ALLOWED_ORIGINS."
)


def is_exempt(path: str) -> bool:
    return any(path == prefix or path.startswith(prefix + "/") for prefix in EXEMPT_WRITES)


def write_refusal(method: str, path: str, headers: Mapping[str, str], origins: OriginPolicy) -> str | None:
    """Why this request is a write from another site's page (`headers`: lower-case names), or None."""
    if method.upper() not in WRITE_METHODS or is_exempt(path):
        return None
    origin = headers.get("origin")
    if origin is not None:
        return None if origins.allows(origin, headers.get("host")) else f"Origin {origin[:100]!r}"
    site = headers.get("sec-fetch-site")
    if site is None or site.strip().lower() == "same-origin":
        return None
    return f"no Origin and Sec-Fetch-Site {site[:40]!r}"


class SameOriginWrites:
    """Answers 403 to a write from another site's page (pure ASGI); everything else passes."""

    def __init__(self, app: ASGIApp, origins: OriginPolicy) -> None:
        self.app = app
        self.origins = origins
        self.told = False

    async def __call__(self, scope: MutableMapping[str, Any], receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers: dict[str, str] = {}
        for name, value in scope.get("headers", ()):  # the first of repeated headers, as Starlette reads
            headers.setdefault(name.decode("latin-1").lower(), value.decode("latin-1"))
        problem = write_refusal(scope.get("method", ""), scope.get("path", ""), headers, self.origins)
        if problem is None:
            await self.app(scope, receive, send)
            return
        if not self.told:  # once: a page behind a proxy that changes the Host needs CHAINLIT_URL
            self.told = True
            logger.warning(
                "refused %s %.200s from another site's page (%s): set CHAINLIT_URL or ALLOWED_ORIGINS if "
                "that page is the app's own; later refusals are not logged",
                scope.get("method"),
                scope.get("path", ""),
                problem,
            )
        body = json.dumps({"detail": REFUSED}).encode()
        response_headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ]
        await send({"type": "http.response.start", "status": 403, "headers": response_headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})
