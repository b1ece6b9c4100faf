"""Sign-in settings: who may use the service, how they prove it, and how guessing is slowed down."""

from __future__ import annotations

from dataclasses import dataclass

from services.config.fields import setting

AUTH_MODES = ("none", "password", "header", "ldap")


@dataclass(frozen=True)
class AccountSettings:
    """How people sign in (Chainlit's OAuth providers are switched on by Chainlit's own variables)."""

    auth_mode: str = setting(
        "none",
        "AUTH_MODE",
        "none = no sign-in (on a loopback address: one local user, history kept; elsewhere the app "
        "refuses to start unless ALLOW_ANONYMOUS=true); password = accounts in the database; header = "
        "a user name set by a trusted auth proxy (AUTH_HEADER, AUTH_PROXY_ADDRESSES); ldap = people in an "
        "LDAP directory (LDAP_URL and the LDAP_* settings).",
        tier="essential",
    )
    admin_username: str = setting(
        "",
        "ADMIN_USERNAME",
        "First administrator (password mode), created at start if missing.",
        tier="essential",
    )
    admin_password: str = setting(
        "",
        "ADMIN_PASSWORD",
        "Its password; when both are empty and no administrator exists, one named `admin` is created "
        "with a generated password printed once to the console.",
        tier="essential",
    )
    auth_header: str = setting(
        "",
        "AUTH_HEADER",
        "Header mode: the request header that carries the user name (e.g. X-Forwarded-User).",
    )
    auth_proxy_addresses: str = setting(
        "",
        "AUTH_PROXY_ADDRESSES",
        "Header mode: comma-separated addresses or networks (10.0.0.5, 10.1.0.0/16) of the proxies "
        "whose AUTH_HEADER is trusted; requests from anywhere else are refused.",
    )
    trusted_proxy_addresses: str = setting(
        "127.0.0.1,::1",
        "TRUSTED_PROXY_ADDRESSES",
        "Reverse proxies (addresses or networks) whose X-Forwarded-For names the client, for per-address "
        "limits; AUTH_PROXY_ADDRESSES count too. Decided by the TCP peer: uvicorn's FORWARDED_ALLOW_IPS "
        "does not make anyone a proxy here. Empty = the peer is always the client.",
    )
    local_token_required: bool = setting(
        False,
        "LOCAL_TOKEN_REQUIRED",
        "Local mode: every sign-in needs the install's token (the /auth/local?token= address printed at "
        "start, kept in DATA_DIR/local-token), also from a browser on this machine. Turn on where other "
        "people have accounts on the machine.",
    )
    oauth_allowed_users: str = setting(
        "",
        "OAUTH_ALLOWED_USERS",
        "OAuth: comma-separated provider identities allowed to sign in (github:octocat, "
        "google:ann@example.com); `*` = anyone the provider vouches for. With OAUTH_ALLOWED_DOMAINS and "
        "OAUTH_ALLOWED_ORGS all empty, OAuth sign-in is refused to all but linked identities.",
    )
    oauth_allowed_domains: str = setting(
        "",
        "OAUTH_ALLOWED_DOMAINS",
        "OAuth: e-mail domains (example.com, exactly) whose verified addresses may sign in.",
    )
    oauth_allowed_orgs: str = setting(
        "",
        "OAUTH_ALLOWED_ORGS",
        "OAuth: GitHub organisations whose active members may sign in (asked of GitHub at sign-in, with "
        "the read:org scope).",
    )
    oauth_provider_timeout_seconds: float = setting(
        10.0,
        "OAUTH_PROVIDER_TIMEOUT_SECONDS",
        "How long a sign-in waits for the provider's answer about organisation membership (no answer = "
        "refused).",
        0.1,
    )
    allow_anonymous: bool = setting(
        False,
        "ALLOW_ANONYMOUS",
        "Serve a non-loopback address without sign-in, on purpose: everyone is anonymous, nothing is stored.",
        tier="essential",
    )
    sign_in_max_failures: int = setting(
        5,
        "SIGN_IN_MAX_FAILURES",
        "Failed sign-ins for one account from one client address within SIGN_IN_WINDOW_SECONDS before "
        "that account must wait there (failures from everywhere: SIGN_IN_MAX_FAILURES_PER_ACCOUNT).",
        1,
    )
    sign_in_max_failures_per_address: int = setting(
        20,
        "SIGN_IN_MAX_FAILURES_PER_ADDRESS",
        "Sign-in attempts per client address (an IPv6 address: per /64) within SIGN_IN_WINDOW_SECONDS, "
        "whatever the account, before each further one from there is slowed "
        "(SIGN_IN_ADDRESS_DELAY_SECONDS). An address is never locked out: everyone behind one NAT "
        "address shares it, and a script there would shut them all out.",
        1,
    )
    sign_in_address_delay_seconds: float = setting(
        2.0,
        "SIGN_IN_ADDRESS_DELAY_SECONDS",
        "Past SIGN_IN_MAX_FAILURES_PER_ADDRESS, an attempt from that address waits this long after its "
        "latest one, twice as long with each further attempt, at most SIGN_IN_LOCKOUT_SECONDS.",
        0.1,
    )
    sign_in_device_days: float = setting(
        30.0,
        "SIGN_IN_DEVICE_DAYS",
        "A browser that signs in with a password gets a device cookie for this long: its sign-ins to that "
        "account then count only its own failures (SIGN_IN_MAX_FAILURES, then SIGN_IN_LOCKOUT_SECONDS), "
        "never its address's nor the account's from everywhere, so no guesser can lock the person out "
        "of their own browser. 0 = no device cookies.",
        0,
    )
    sign_in_max_failures_per_account: int = setting(
        25,
        "SIGN_IN_MAX_FAILURES_PER_ACCOUNT",
        "Failed sign-ins for one account from all addresses together within SIGN_IN_WINDOW_SECONDS before "
        "it must wait everywhere (guessing from many addresses). Always above "
        "SIGN_IN_MAX_FAILURES_PER_ADDRESS (a smaller value counts as that + 1): one address alone can "
        "never lock an account out. 25 keeps guessing at one account under ~100 an hour (OWASP ASVS 2.2.1).",
        1,
    )
    sign_in_window_seconds: float = setting(
        900.0, "SIGN_IN_WINDOW_SECONDS", "Window over which failed sign-ins are counted.", 1
    )
    sign_in_lockout_seconds: float = setting(
        300.0,
        "SIGN_IN_LOCKOUT_SECONDS",
        "How long an account waits at one address (or in one browser), or everywhere, after too many "
        "failures; the longest wait of a slowed address.",
        1,
    )
    sign_in_lifetime_seconds: float = setting(
        43_200.0,
        "SIGN_IN_LIFETIME_SECONDS",
        "A sign-in's absolute lifetime (12 h, OWASP ASVS level 2): then its cookie is refused however "
        "recently it was used, and refreshing it (POST /auth/jwt) does not extend it. Also the cookie's "
        "Max-Age (it replaces user_session_timeout of .chainlit/config.toml).",
        60,
    )
    sign_in_check_seconds: float = setting(
        30.0,
        "SIGN_IN_CHECK_SECONDS",
        "LDAP mode with LDAP_BIND_DN: how long a process trusts what the directory last said of a "
        "signed-in person (removed from it, or moved in or out of the admins' group: signed out within "
        "this time). Accounts in the database are read at every check: a sign-out, new password, new "
        "role or removal ends their sign-ins at once in every process.",
        0,
    )
