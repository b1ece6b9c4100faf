"""The admin page's CSRF token: one per sign-in, checked on every POST beside the Origin header.

The token is an HMAC, under a key derived from the cookie-signing secret, of what identifies the
sign-in: the account, the session generation and the moment it signed in (the claim every cookie
carries, services/accounts/sessions.py). It needs no storage, stays the same when Chainlit refreshes
the cookie, and changes with every new sign-in; another site's page cannot read it (it is only in the
admin page's forms, which Content-Security-Policy and X-Frame-Options keep from other sites).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Mapping
from typing import Any

FIELD = "csrf"  # the form field that carries it
PURPOSE = b"vllm-chat admin csrf v1"


def _key(secret: str) -> bytes:
    return hmac.new(secret.encode(), PURPOSE, hashlib.sha256).digest()


def sign_in_of(identifier: str, metadata: Mapping[str, Any] | None) -> str:
    """What names one sign-in: the account, and its claim's generation and sign-in time."""
    claim = (metadata or {}).get("session") or {}
    return f"{identifier}\n{claim.get('generation')}\n{claim.get('signed_in_at')}"


def token_for(secret: str, sign_in: str) -> str:
    digest = hmac.new(_key(secret), sign_in.encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def token_matches(secret: str, sign_in: str, offered: str | None) -> bool:
    """True only for this sign-in's token (compared in constant time); never for an empty secret."""
    if not secret or not offered or len(offered) > 100:
        return False
    return hmac.compare_digest(token_for(secret, sign_in).encode(), offered.encode())
