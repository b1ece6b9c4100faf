"""OAuth sign-in: whose provider identity may come in, and under which name.

A provider's user is `<provider>:<name>` (`github:octocat`, `google:ann@example.com`), never the
local account that happens to share the name: a GitHub user called `admin` is `github:admin`. Only
an administrator's link (`python -m services.accounts link alice github:alice-gh`) makes a provider
identity sign in as a local account. Anyone else needs the allowlist: OAUTH_ALLOWED_USERS (named
identities, or `*`), OAUTH_ALLOWED_DOMAINS (a verified e-mail address in the domain) or
OAUTH_ALLOWED_ORGS (an active member of the GitHub organisation, asked of GitHub with the person's
token). With none of them set, OAuth sign-in is refused to all but linked identities.

What Chainlit 2.12 hands over (chainlit/oauth_providers.py): for GitHub, `default_user.identifier`
is the login and `raw_user_data` is GET /user plus `emails` (GET /user/emails: address, verified,
primary); for Google, the identifier is the e-mail and `raw_user_data` is userinfo v2
(`email`, `verified_email`, `hd`, ...).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx

from services.accounts.names import AccountError, parse_identity, provider_identity
from services.accounts.store import AccountStore
from services.config import Settings, SettingsError

logger = logging.getLogger(__name__)

ORG_SCOPE = "read:org"  # GitHub: needed to see the person's organisation memberships
OrgMember = Callable[[str, str], Awaitable[bool]]  # (organisation, access token) -> active member?


def verified_emails(raw_user_data: dict[str, Any]) -> list[str]:
    """The person's e-mail addresses the provider says are verified (lower-case)."""
    found = []
    for entry in raw_user_data.get("emails") or []:  # GitHub
        if isinstance(entry, dict) and entry.get("verified") is True and isinstance(entry.get("email"), str):
            found.append(entry["email"])
    email = raw_user_data.get("email")  # Google (verified_email), OpenID Connect (email_verified)
    verified = (raw_user_data.get("verified_email"), raw_user_data.get("email_verified"))
    if isinstance(email, str) and True in verified:
        found.append(email)
    return [address.strip().lower() for address in found]


def _split(spec: str) -> tuple[str, ...]:
    return tuple(part.strip().lower() for part in spec.split(",") if part.strip())


@dataclass(frozen=True)
class OAuthAllowlist:
    """Who may sign in through a provider without an administrator's link."""

    users: frozenset[str]
    domains: frozenset[str]
    orgs: tuple[str, ...]

    @classmethod
    def from_settings(cls, settings: Settings) -> OAuthAllowlist:
        named = _split(settings.oauth_allowed_users)
        try:
            users = frozenset(name if name == "*" else parse_identity(name) for name in named)
        except AccountError as error:
            raise SettingsError(f"OAUTH_ALLOWED_USERS: {error}") from None
        domains = frozenset(domain.lstrip("@") for domain in _split(settings.oauth_allowed_domains))
        return cls(users, domains, _split(settings.oauth_allowed_orgs))

    @property
    def empty(self) -> bool:
        return not (self.users or self.domains or self.orgs)

    async def allows(
        self,
        provider_id: str,
        identity: str,
        raw_user_data: dict[str, Any],
        token: str,
        org_member: OrgMember,
    ) -> str | None:
        """The rule that lets `identity` in (for the log), or None."""
        if "*" in self.users or identity in self.users:
            return "OAUTH_ALLOWED_USERS"
        for email in verified_emails(raw_user_data) if self.domains else []:
            if email.rpartition("@")[2] in self.domains:
                return f"verified e-mail {email}"
        for org in self.orgs if provider_id == "github" else ():
            if await org_member(org, token):
                return f"member of the GitHub organisation {org}"
        return None


class OAuthGate:
    """Who a provider's user signs in as: the account an administrator linked their identity to,
    else their own `<provider>:<name>` when the allowlist lets them in, else no one."""

    def __init__(
        self, allowlist: OAuthAllowlist, accounts: AccountStore | None, org_member: OrgMember
    ) -> None:
        self.allowlist = allowlist
        self.accounts = accounts
        self.org_member = org_member

    async def identifier_for(
        self, provider_id: str, name: str, raw_user_data: dict[str, Any], token: str
    ) -> str | None:
        try:
            identity = provider_identity(provider_id, name)
        except AccountError:
            return None
        if (linked := await self._linked_account(identity)) is not None:
            logger.info("OAuth sign-in of %s as %s (linked)", identity, linked)
            return linked
        rule = await self.allowlist.allows(provider_id, identity, raw_user_data, token, self.org_member)
        if rule is None:
            unset = " (none is set: only linked identities get in)" if self.allowlist.empty else ""
            logger.warning(
                "OAuth sign-in of %s refused: not linked to an account, not allowed by "
                "OAUTH_ALLOWED_USERS, _DOMAINS or _ORGS%s",
                identity,
                unset,
            )
            return None
        logger.info("OAuth sign-in of %s: %s", identity, rule)
        return identity

    async def _linked_account(self, identity: str) -> str | None:
        if self.accounts is None:
            return None
        try:
            return await self.accounts.linked_account(identity)
        except Exception as error:  # the database cannot answer: the allowlist still decides
            logger.warning("could not look up the link of %s: %s", identity, error)
            return None


class GitHubOrgs:
    """Asks GitHub whether the signed-in person is an active member of an organisation
    (GET /user/memberships/orgs/{org} with their token: 200 and state "active"; 404 otherwise)."""

    def __init__(self, api_url: str, timeout_seconds: float) -> None:
        self.api_url = api_url.rstrip("/")
        self.timeout_seconds = timeout_seconds

    async def __call__(self, org: str, token: str) -> bool:
        url = f"{self.api_url}/user/memberships/orgs/{quote(org, safe='')}"
        headers = {"Authorization": f"Bearer {token}", "Accept": "application/vnd.github+json"}
        try:
            async with httpx.AsyncClient(timeout=self.timeout_seconds) as http:
                response = await http.get(url, headers=headers)
            answer = response.json() if response.status_code == 200 else None
        except (httpx.HTTPError, ValueError) as error:
            logger.warning("GitHub did not answer about organisation %s: %s", org, error)
            return False
        return isinstance(answer, dict) and answer.get("state") == "active"


def github_api_url() -> str:
    """GitHub's API, beside the user-info address Chainlit's provider calls (GitHub Enterprise sets
    OAUTH_GITHUB_USER_INFO_URL to https://<host>/api/v3/user)."""
    user_info = os.environ.get("OAUTH_GITHUB_USER_INFO_URL", "https://api.github.com/user")
    return user_info.rstrip("/").removesuffix("/user")


def ask_github_for_org_memberships() -> None:
    """Add read:org to the scope Chainlit's GitHub provider asks for (it asks for user:email only)."""
    from chainlit.oauth_providers import get_oauth_provider

    provider = get_oauth_provider("github")
    scope = provider.authorize_params.get("scope", "") if provider is not None else ""
    if provider is not None and ORG_SCOPE not in scope.split():
        provider.authorize_params["scope"] = f"{scope} {ORG_SCOPE}".strip()
