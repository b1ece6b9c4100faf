"""Who may use /admin, and what a POST must carry: the sign-in cookie of an administrator (the role
read from the database, as everywhere), an Origin the app allows, a form of bounded fields and the
sign-in's CSRF token.

- no sign-in (or an ended one): GET is sent to /login, anything else gets 401;
- a signed-in person who is not an administrator: 403 on every /admin path and method;
- a POST without an allowed Origin (a form on another site, a script that does not say), or without
  this sign-in's CSRF token: 403, before the form is acted on. SameSite cookies alone would still
  let a page on a sibling subdomain post with the administrator's cookie;
- a form that is not urlencoded, repeats a field, or carries too many or too long fields: 400.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import parse_qsl

from chainlit.auth import get_token_from_cookies
from chainlit.auth.jwt import decode_jwt
from fastapi import Request

from services.accounts.secret import ENV_NAME
from services.accounts.sign_in import SignIn
from services.admin import csrf

MAX_FIELDS = 20
MAX_FIELD_CHARS = 1024
FORM_TYPE = "application/x-www-form-urlencoded"


class Origins(Protocol):
    """Which web origins may post (services/web/origins.py's OriginPolicy)."""

    def allows(self, origin: str | None, host: str | None) -> bool: ...


class Refusal(Exception):
    """An /admin request that is refused: its status, what to say, and where to send a browser."""

    def __init__(self, status: int, message: str, location: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.location = location


@dataclass(frozen=True)
class Admin:
    """The administrator behind a request, and their sign-in's CSRF token."""

    identifier: str
    sign_in_id: str  # what names this sign-in (csrf.sign_in_of)
    csrf_token: str


class AdminGate:
    def __init__(self, sign_in: SignIn | None, origins: Origins) -> None:
        self.sign_in = sign_in
        self.origins = origins

    @staticmethod
    def _secret() -> str:
        return os.environ.get(ENV_NAME, "")

    async def admin(self, request: Request) -> Admin:
        """The administrator signed in on this request; Refusal otherwise (see the module)."""
        sign_in = self.sign_in
        if sign_in is None or not sign_in.required:
            raise Refusal(403, "The admin page needs sign-in, and this service has none.")
        token = get_token_from_cookies(dict(request.cookies))
        user = None
        if token and not await sign_in.sessions.token_problem(token):
            try:
                user = decode_jwt(token)
            except Exception:
                user = None
        if user is None:
            location = "/login" if request.method in ("GET", "HEAD") else None
            raise Refusal(401, "Sign in as an administrator first.", location)
        if await sign_in.role_of(user) != "admin":
            raise Refusal(403, "Only administrators may use the admin page.")
        sign_in_id = csrf.sign_in_of(user.identifier, user.metadata)
        return Admin(user.identifier, sign_in_id, csrf.token_for(self._secret(), sign_in_id))

    def check_origin(self, request: Request) -> None:
        origin = request.headers.get("origin")
        if not origin or not self.origins.allows(origin, request.headers.get("host")):
            raise Refusal(403, "Refused: this form was not sent from the app's own page (Origin).")

    async def form(self, request: Request, admin: Admin) -> dict[str, str]:
        """The POST's fields, checked: an allowed Origin, urlencoded, bounded, this sign-in's token."""
        self.check_origin(request)
        if request.headers.get("content-type", "").split(";")[0].strip().lower() != FORM_TYPE:
            raise Refusal(400, f"Refused: a form must be sent as {FORM_TYPE}.")
        fields = parse_form((await request.body()).decode("utf-8", errors="replace"))
        if not csrf.token_matches(self._secret(), admin.sign_in_id, fields.get(csrf.FIELD)):
            raise Refusal(403, "Refused: the form's security token is missing or wrong. Reload the page.")
        return fields


def parse_form(body: str) -> dict[str, str]:
    """An urlencoded body as one value per field; Refusal(400) for too many, repeated or long fields."""
    try:
        pairs = parse_qsl(body, keep_blank_values=True, max_num_fields=MAX_FIELDS, strict_parsing=bool(body))
    except ValueError:
        raise Refusal(400, f"Refused: a form of at most {MAX_FIELDS} well-formed fields.") from None
    fields: dict[str, str] = {}
    for name, value in pairs:
        if name in fields:
            raise Refusal(400, f"Refused: the field {name[:40]!r} is given twice.")
        if len(name) > 64 or len(value) > MAX_FIELD_CHARS or not (name + value).isprintable():
            raise Refusal(400, f"Refused: the field {name[:40]!r} is too long or holds control characters.")
        fields[name] = value
    return fields
