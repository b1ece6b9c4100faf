"""LDAP sign-in settings (AUTH_MODE=ldap): where the directory is, how a person's entry is found,
which group makes administrators; checked at start."""

from __future__ import annotations

from dataclasses import dataclass

from ldap3.core.exceptions import LDAPInvalidDnError
from ldap3.utils.dn import parse_dn

from services.config.fields import SettingsError, setting

USERNAME_PLACEHOLDER = "{username}"


@dataclass(frozen=True)
class LdapSettings:
    """The directory that AUTH_MODE=ldap asks (ldap3, one connection per sign-in, nothing cached)."""

    ldap_url: str = setting(
        "",
        "LDAP_URL",
        "LDAP mode: the directory, ldap://host[:port] or ldaps://host[:port]. Beyond loopback use "
        "ldaps:// or LDAP_START_TLS=true: people's passwords cross the network. The other LDAP_* "
        "settings: docs/settings.md.",
        tier="tuning",
    )
    ldap_user_dn_template: str = setting(
        "",
        "LDAP_USER_DN_TEMPLATE",
        "LDAP mode: a person's DN, {username} standing for the name typed (escaped), e.g. "
        "uid={username},ou=people,dc=example,dc=org. Or leave it empty and search (LDAP_USER_SEARCH_BASE).",
    )
    ldap_user_search_base: str = setting(
        "",
        "LDAP_USER_SEARCH_BASE",
        "LDAP mode, search-then-bind: where people's entries are searched (subtree) with LDAP_USER_FILTER, "
        "as LDAP_BIND_DN; exactly one entry must match.",
    )
    ldap_user_filter: str = setting(
        "(uid={username})",
        "LDAP_USER_FILTER",
        "LDAP mode, search-then-bind: the filter, {username} standing for the name typed (escaped).",
    )
    ldap_bind_dn: str = setting(
        "",
        "LDAP_BIND_DN",
        "LDAP mode: the service account that searches for people (needed by LDAP_USER_SEARCH_BASE) and, "
        "when set, checks signed-in people every SIGN_IN_CHECK_SECONDS (removed or regrouped: signed out).",
    )
    ldap_bind_password: str = setting("", "LDAP_BIND_PASSWORD", "LDAP mode: its password (never logged).")
    ldap_admin_group_dn: str = setting(
        "",
        "LDAP_ADMIN_GROUP_DN",
        "LDAP mode: the group whose members are administrators, read at every sign-in: a groupOfNames "
        "(`member`), groupOfUniqueNames (`uniqueMember`) or posixGroup (`memberUid`). Empty = no admins.",
    )
    ldap_start_tls: bool = setting(
        False, "LDAP_START_TLS", "LDAP mode: upgrade an ldap:// connection with StartTLS before binding."
    )
    ldap_ca_file: str = setting(
        "",
        "LDAP_CA_FILE",
        "LDAP mode: CA certificates (PEM) that the directory's certificate must chain to (ldaps:// or "
        "StartTLS); empty = the system's.",
    )
    ldap_timeout_seconds: float = setting(
        5.0,
        "LDAP_TIMEOUT_SECONDS",
        "LDAP mode: how long a sign-in waits to connect to the directory and for each answer (no "
        "answer = sign-in unavailable, 503).",
        0.1,
    )


def check_ldap(settings: LdapSettings, auth_mode: str) -> None:
    """Raise SettingsError (naming the variables) when AUTH_MODE=ldap cannot work as configured."""
    if auth_mode != "ldap":
        return
    s = settings
    scheme, _, host = s.ldap_url.partition("://")
    if scheme.lower() not in ("ldap", "ldaps") or not host.strip("/"):
        raise SettingsError(f"AUTH_MODE=ldap needs LDAP_URL=ldap://host or ldaps://host (got {s.ldap_url!r})")
    if s.ldap_start_tls and s.ldap_url.lower().startswith("ldaps://"):
        raise SettingsError("LDAP_START_TLS=true is for ldap:// URLs; ldaps:// is TLS already")
    if bool(s.ldap_bind_dn) != bool(s.ldap_bind_password):
        raise SettingsError("LDAP_BIND_DN and LDAP_BIND_PASSWORD are set together (or neither)")
    if bool(s.ldap_user_dn_template) == bool(s.ldap_user_search_base):
        raise SettingsError(
            "AUTH_MODE=ldap needs one way to find a person's entry: LDAP_USER_DN_TEMPLATE "
            "(uid={username},ou=people,...) or LDAP_USER_SEARCH_BASE (with LDAP_BIND_DN), not both"
        )
    if s.ldap_user_dn_template and s.ldap_user_dn_template.count(USERNAME_PLACEHOLDER) != 1:
        raise SettingsError("LDAP_USER_DN_TEMPLATE must contain {username} once")
    if s.ldap_user_search_base:
        if not s.ldap_bind_dn:
            raise SettingsError("LDAP_USER_SEARCH_BASE needs LDAP_BIND_DN and LDAP_BIND_PASSWORD to search")
        flt = s.ldap_user_filter
        if flt.count(USERNAME_PLACEHOLDER) != 1 or not (flt.startswith("(") and flt.endswith(")")):
            raise SettingsError("LDAP_USER_FILTER must be a parenthesised filter containing {username} once")
    for name in ("LDAP_BIND_DN", "LDAP_USER_SEARCH_BASE", "LDAP_ADMIN_GROUP_DN", "LDAP_USER_DN_TEMPLATE"):
        _check_dn(name, getattr(s, name.lower()))
    if s.ldap_ca_file and not _readable(s.ldap_ca_file):
        raise SettingsError(f"LDAP_CA_FILE={s.ldap_ca_file!r} cannot be read")


def _check_dn(name: str, dn: str) -> None:
    try:
        if dn:
            parse_dn(dn.replace(USERNAME_PLACEHOLDER, "x"))
    except LDAPInvalidDnError:
        raise SettingsError(f"{name}={dn!r} is not a DN (attribute=value,...)") from None


def _readable(path: str) -> bool:
    try:
        with open(path, "rb"):
            return True
    except OSError:
        return False
