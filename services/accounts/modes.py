"""The sign-in mode for the settings and the bind address, or a refusal to start without one."""

from __future__ import annotations

import logging

from services.accounts.addresses import is_loopback
from services.config import Settings, SettingsError

logger = logging.getLogger(__name__)


def refusal(host: str) -> str:
    return (
        f"Refusing to start: the app is bound to {host}, which other machines can reach, and no sign-in "
        "is configured. Choose one:\n"
        "  AUTH_MODE=password   accounts in the database (first admin: ADMIN_USERNAME + ADMIN_PASSWORD,\n"
        "                       or one is generated and printed);\n"
        "                       manage them with python -m services.accounts\n"
        "  AUTH_MODE=header     behind an auth proxy: AUTH_HEADER + AUTH_PROXY_ADDRESSES\n"
        "  AUTH_MODE=ldap       people in an LDAP directory: LDAP_URL + LDAP_USER_DN_TEMPLATE (see README)\n"
        "  OAUTH_<PROVIDER>_CLIENT_ID + _CLIENT_SECRET   Chainlit's OAuth providers (see README)\n"
        "  ALLOW_ANONYMOUS=true serve everyone anonymously, on purpose (nothing is stored)\n"
        "or bind to 127.0.0.1 (the default)."
    )


def resolve_mode(settings: Settings, bind_host: str, oauth_providers: list[str]) -> str:
    """The sign-in mode; raises SettingsError (with what to do) for a public address without sign-in."""
    if settings.auth_mode in ("password", "header", "ldap"):
        return settings.auth_mode
    if oauth_providers:
        return "oauth"
    if is_loopback(bind_host):
        return "local"
    if settings.allow_anonymous:
        logger.warning("ALLOW_ANONYMOUS=true on %s: no sign-in, nothing is stored", bind_host)
        return "anonymous"
    raise SettingsError(refusal(bind_host))
