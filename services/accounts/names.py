"""Names of people: local account names, and provider identities (`<provider>:<name>`) kept apart
from them."""

from __future__ import annotations

import re

MAX_USERNAME_CHARS = 128
PROVIDER_ID = re.compile(r"^[a-z0-9][a-z0-9-]{0,31}$")


class AccountError(ValueError):
    """A request about accounts that cannot be done (message for the operator)."""


def normalize_username(username: str) -> str:
    """Usernames are case-insensitive (people type e-mail addresses in any case)."""
    name = username.strip().lower()
    if not name or len(name) > MAX_USERNAME_CHARS or any(c.isspace() or not c.isprintable() for c in name):
        raise AccountError(
            f"{username!r} is not a valid username (1-{MAX_USERNAME_CHARS} characters, no spaces)"
        )
    return name


def provider_identity(provider_id: str, name: str) -> str:
    """A provider's user as `<provider>:<name>` (github:octocat), the name case-folded as usernames are;
    the namespace keeps them apart from local accounts. AccountError when it is not one."""
    provider = provider_id.strip().lower()
    if not PROVIDER_ID.match(provider):
        raise AccountError(f"{provider_id!r} is not a provider name")
    return f"{provider}:{normalize_username(name)}"


def parse_identity(text: str) -> str:
    """A provider identity as an administrator writes it (`github:Octocat`), normalized."""
    provider, separator, name = text.partition(":")
    if not separator or not name:
        raise AccountError(f"{text!r} is not a provider identity (write it as github:<login>)")
    return provider_identity(provider, name)
