"""Who may use the service and how they prove it: the sign-in mode, and Chainlit's auth callbacks.

Every user a callback returns carries the session claim (services/accounts/sessions.py) that lets
the app end the sign-in. Modes (resolved once, at import, from AUTH_MODE, Chainlit's OAuth variables
and the bind address):
- local:     no sign-in configured, bound to loopback: one local user (admin), signed in without a
             login form through Chainlit's header sign-in, only for a browser on this machine under
             a loopback name (services/accounts/local.py), or with the install's token;
- password:  accounts in the database (argon2), limited failed attempts;
- header:    a user name in AUTH_HEADER, trusted only from a TCP peer in AUTH_PROXY_ADDRESSES;
- ldap:      people in an LDAP directory, through the password form (ldap_sign_in.py);
- oauth:     Chainlit's OAuth providers (their own OAUTH_* variables), with or without password; a
             provider's user is `<provider>:<name>` and needs the allowlist or a link (oauth.py);
- anonymous: ALLOW_ANONYMOUS=true on a public address: no sign-in, nothing stored.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from chainlit.user import User

from services.accounts import local
from services.accounts.addresses import in_networks, networks
from services.accounts.devices import DeviceCookies
from services.accounts.ldap_sign_in import ldap_sign_in_for
from services.accounts.limits import SignInLimiter
from services.accounts.local import LOCAL_USER
from services.accounts.oauth import GitHubOrgs, OAuthAllowlist, OAuthGate, OrgMember, github_api_url
from services.accounts.passwords import check_password_async, generated_password
from services.accounts.sessions import Sessions
from services.accounts.shared_attempts import SharedAttempts, SignInAttempts
from services.accounts.store import Account, AccountError, AccountStore, normalize_username
from services.admission.shared_database import SharedDatabase
from services.audit import actions
from services.audit.log import AuditLog
from services.config import Settings

logger = logging.getLogger(__name__)


@dataclass
class SignInRequest:
    """The HTTP request a callback serves: who asks, and a refusal that replaces Chainlit's 401.

    `peer` is the TCP peer (what trust is decided on); `address` is the client for per-address
    limits: the peer, or the client a trusted proxy names (services/web/peers.py).
    Chainlit passes the callbacks only the form or the headers, and turns any exception they raise
    into a logged error and a plain 401; services/web's middleware sets this per request and sends
    `refusal` (status, detail, Retry-After seconds) instead of the 401 when a callback sets it, and
    adds `set_device_cookie` to a sign-in that succeeded.
    """

    address: str | None
    peer: str | None = None
    refusal: tuple[int, str, int | None] | None = None
    device_cookie: str | None = None  # the request's device cookie (devices.py), unchecked
    set_device_cookie: str | None = None  # a Set-Cookie value the middleware adds to a good sign-in


current_request: contextvars.ContextVar[SignInRequest | None] = contextvars.ContextVar(
    "sign_in_request", default=None
)


def client_address() -> str | None:
    request = current_request.get()
    return request.address if request is not None else None


def client_peer() -> str | None:
    request = current_request.get()
    return request.peer if request is not None else None


def refuse(status: int, detail: str, retry_after_seconds: int | None = None) -> None:
    """Answer this sign-in with `status` and `detail` instead of Chainlit's 401."""
    if (request := current_request.get()) is not None:
        request.refusal = (status, detail, retry_after_seconds)


class SignIn:
    """Chainlit's auth callbacks for the resolved mode, over the account store."""

    def __init__(
        self,
        settings: Settings,
        mode: str,
        accounts: AccountStore | None,
        local_token: str | None = None,
        org_member: OrgMember | None = None,
        audit: AuditLog | None = None,
        shared: SharedDatabase | None = None,
    ) -> None:
        """`local_token`: the install's token (local mode); `org_member`: who answers "is this person
        in that GitHub organisation?" (GitHub itself unless given); `audit`: where sign-ins are recorded;
        `shared`: where every replica's attempts are counted too (SHARED_LIMITS), None: here only."""
        self.settings = settings
        self.audit = audit
        self.mode = mode
        self.accounts = accounts
        self.local_token = local_token
        proxies = settings.auth_proxy_addresses if mode == "header" else ""
        self.proxies = networks(proxies, "AUTH_PROXY_ADDRESSES")
        org_member = org_member or GitHubOrgs(github_api_url(), settings.oauth_provider_timeout_seconds)
        self.oauth_gate = OAuthGate(OAuthAllowlist.from_settings(settings), accounts, org_member)
        local = SignInLimiter(
            settings.sign_in_max_failures,
            settings.sign_in_max_failures_per_address,
            settings.sign_in_max_failures_per_account,
            settings.sign_in_window_seconds,
            settings.sign_in_lockout_seconds,
            settings.sign_in_address_delay_seconds,
        )
        self.devices = DeviceCookies(settings.sign_in_device_days * 86_400)
        self.limiter = SignInAttempts(local, SharedAttempts(local, shared) if shared is not None else None)
        self.ldap = ldap_sign_in_for(settings, mode, accounts, self.limiter)
        self.sessions = Sessions(
            mode,
            accounts,
            settings.sign_in_lifetime_seconds,
            recheck=self.ldap.session_problem if self.ldap else None,
        )

    @property
    def required(self) -> bool:
        """True when every visitor has a user (all modes but anonymous)."""
        return self.mode != "anonymous"

    async def password(self, username: str, password: str) -> User | None:
        """Chainlit's password_auth_callback: None = wrong name or password (401).

        The attempt is counted before the hash (for every replica when shared, else in this process
        before anything is awaited: shared_attempts.py): guesses sent at once cannot all pass the
        limit before the first of them is counted. A browser with a good device cookie for the account
        is counted by itself (devices.py) and gets a new cookie with each good sign-in."""
        address = client_address()
        try:
            identifier = normalize_username(username)
        except AccountError:
            identifier = username[:64]
        request = current_request.get()
        device = self.devices.device_of(request.device_cookie if request else None, identifier)
        if wait := await self.limiter.attempt(identifier, address, device):
            logger.warning(
                "sign-in refused for %s from %s: too many failures (%d s left)", identifier, address, wait
            )
            refuse(429, f"Too many failed sign-ins. Try again in {wait} seconds.", wait)
            return None
        assert self.accounts is not None
        try:
            account = await self.accounts.get(identifier)
        except Exception as error:
            await self.limiter.withdraw(identifier, address, device)  # not a guess: nothing was checked
            logger.warning("sign-in unavailable: %s", error)
            refuse(
                503, "Sign-in is unavailable right now: the database cannot be reached. Try again shortly."
            )
            return None
        usable = account is not None and not account.disabled
        matches = await check_password_async(account.password_hash if usable else None, password)  # type: ignore[union-attr]
        if not (usable and matches):
            return await self._failed(identifier, address)
        assert account is not None
        return await self._signed_in(account, password, address, device, request)

    async def _signed_in(
        self,
        account: Account,
        password: str,
        address: str | None,
        device: str | None,
        request: SignInRequest | None,
    ) -> User:
        """A right password: its attempt taken back, the browser remembered, the sign-in recorded."""
        identifier = account.identifier
        await self.limiter.succeeded(identifier, address, device)
        if request is not None and (cookie := self.devices.issue(identifier)) is not None:
            request.set_device_cookie = self.devices.set_cookie(cookie)
        await self._record(identifier, actions.SIGN_IN, "password", address)
        try:
            assert self.accounts is not None
            await self.accounts.rehash_if_needed(account, password)
        except Exception:
            logger.exception("could not upgrade the password hash of %s", identifier)
        user = User(identifier=identifier, metadata={"role": account.role, "provider": "password"})
        return self.sessions.stamp(user, account.generation)

    async def ldap_password(self, username: str, password: str) -> User | None:
        """Chainlit's password_auth_callback in LDAP mode: the directory decides (ldap_sign_in.py)."""
        assert self.ldap is not None
        if (signed := await self.ldap.sign_in(username, password, client_address(), refuse)) is None:
            return None
        return self.sessions.stamp(*signed)

    async def header(self, headers: Mapping[str, str]) -> User | None:
        """Chainlit's header_auth_callback: the local user (local mode) or the proxy's user (header mode).

        Trust is decided on the TCP peer, never on X-Forwarded-For (any client can write that)."""
        peer = client_peer()
        if self.mode == "local":
            problem = "LOCAL_TOKEN_REQUIRED=true" if self.settings.local_token_required else None
            if problem := problem or local.sign_in_problem(peer, headers):
                logger.warning(
                    "local sign-in refused: %s. Use the install's token (printed at start), "
                    "or configure AUTH_MODE",
                    problem,
                )
                return None
            return self.local_user()
        if not in_networks(peer, self.proxies):
            logger.warning("header sign-in refused: %s is not in AUTH_PROXY_ADDRESSES", peer)
            return None
        try:
            identifier = normalize_username(headers.get(self.settings.auth_header.lower(), ""))
        except AccountError:
            return None
        return await self._known_user(identifier, "header")

    def local_user(self) -> User:
        """The one local user (local mode), with the session claim its cookie carries."""
        user = User(identifier=LOCAL_USER, metadata={"role": "admin", "provider": "local"})
        return self.sessions.stamp(user, 0)

    def local_user_for_token(self, offered: str) -> User | None:
        """The local user, for the install's token (local mode only); None for anything else."""
        if self.mode != "local" or not self.local_token or not local.token_matches(self.local_token, offered):
            return None
        return self.local_user()

    async def oauth(
        self,
        provider_id: str,
        token: str,
        raw_user_data: dict,
        default_user: User,
        id_token: str | None = None,
    ) -> User | None:
        """Chainlit's oauth_callback: `<provider>:<name>`, or the account an administrator linked it to;
        anyone else only when the allowlist lets them in (services/accounts/oauth.py)."""
        identifier = await self.oauth_gate.identifier_for(
            provider_id, default_user.identifier, raw_user_data, token
        )
        if identifier is None:
            return None
        return await self._known_user(identifier, provider_id, default_user.metadata)

    async def _known_user(self, identifier: str, provider: str, extra: dict | None = None) -> User | None:
        """A user vouched for by a proxy or provider: refused if removed; role from the account, else user."""
        account = None
        if self.accounts is not None:
            try:
                account = await self.accounts.get(identifier)
            except Exception as error:  # the proxy vouched: let them chat, as a plain user
                logger.warning("account lookup failed for %s: %s", identifier, error)
        if account is not None and account.disabled:
            logger.info("sign-in refused for removed account %s", identifier)
            return None
        role = account.role if account is not None else "user"
        await self._record(identifier, actions.SIGN_IN, provider, client_address())
        user = User(identifier=identifier, metadata={**(extra or {}), "role": role, "provider": provider})
        return self.sessions.stamp(user, account.generation if account is not None else 0)

    async def _failed(self, identifier: str, address: str | None) -> None:
        logger.info("sign-in failed for %s from %s", identifier, address)
        await self._record(identifier, actions.SIGN_IN_FAILED, "password", address)

    async def _record(self, identifier: str, action: str, mode: str, address: str | None) -> None:
        """One audit entry for a sign-in (a short INSERT: sign-in may wait for it)."""
        if self.audit is not None:
            await self.audit.record(identifier, action, identifier, {"mode": mode}, address)

    async def role_of(self, user: Any) -> str:
        """The user's role now (the database's word; the cookie's when the database cannot answer)."""
        claimed = ((getattr(user, "metadata", None) or {}).get("role")) or "user"
        if self.mode == "local" or self.accounts is None or user is None:
            return claimed
        try:
            account = await self.accounts.get(user.identifier)
        except Exception:
            return claimed
        return account.role if account is not None and not account.disabled else "user"

    async def ensure_first_accounts(self) -> None:
        """Password mode: create ADMIN_USERNAME, or an `admin` with a printed password when none exists.
        Local mode: the local user's account (no password), so its API keys have an owner."""
        if self.accounts is None:
            return
        if self.mode == "local":
            if await self.accounts.get(LOCAL_USER) is None:
                with contextlib.suppress(AccountError):  # another replica made it first
                    await self.accounts.add(LOCAL_USER, None, "admin")
            return
        if self.mode != "password":
            return
        settings = self.settings
        if settings.admin_username:
            name = normalize_username(settings.admin_username)
            current = await self.accounts.get(name)
            if current is None or current.disabled:
                try:
                    await self.accounts.add(settings.admin_username, settings.admin_password, "admin")
                except AccountError:
                    if current is not None or await self.accounts.get(name) is None:
                        raise
                    return  # another replica, starting at the same time, made it first
                logger.info("created administrator %s (ADMIN_USERNAME)", settings.admin_username)
            return
        if await self.accounts.admins():
            return
        password = generated_password()
        try:
            await self.accounts.add("admin", password, "admin")
        except AccountError:
            return  # another replica made it first
        print_once_banner(password)


def print_once_banner(password: str) -> None:
    """The generated administrator password, on the console only (never in a log file)."""
    print(
        "\n" + "=" * 72 + "\nNo administrator existed, so one was created:\n"
        f"    username: admin\n    password: {password}\n"
        "This is shown once. Change it with: python -m services.accounts reset-password admin\n" + "=" * 72,
        file=sys.stderr,
        flush=True,
    )
