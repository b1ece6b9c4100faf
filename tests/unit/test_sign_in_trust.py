"""Whom sign-in trusts, without a model: the TCP peer against X-Forwarded-For (uvicorn's own
middleware, then ours), local mode's rules, and OAuth's decision with realistic provider answers
(GitHub's organisation lookup replaced by a fake: the tests cannot reach GitHub; the security suite
asks a fake GitHub over HTTP) and administrators' links in a real SQLite database."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import uvicorn
from chainlit.auth.jwt import create_jwt
from chainlit.user import User
from starlette.datastructures import Headers

from services.accounts.addresses import forwarded_client, networks
from services.accounts.local import (
    is_loopback_host,
    load_or_create_token,
    origin_problem,
    sign_in_problem,
    token_banner,
)
from services.accounts.oauth import OAuthAllowlist, verified_emails
from services.accounts.sign_in import SignIn, SignInRequest, current_request
from services.accounts.store import AccountError, AccountStore
from services.config import Settings, SettingsError
from services.history.database import create_engine
from services.history.migrations import migrate
from services.web.local_access import refusal
from services.web.peers import PEER_KEY, ClientAddresses, PeerRecordingProxyHeaders, record_peers

LOOPBACK = networks("127.0.0.1,::1", "TRUSTED_PROXY_ADDRESSES")

# What Chainlit 2.12's providers hand the callback (chainlit/oauth_providers.py): GitHub's GET /user
# plus `emails` from GET /user/emails; Google's userinfo v2.
GITHUB_ADMIN = {
    "login": "Admin", "id": 4242, "avatar_url": "https://avatars.example/u/4242", "email": None,
    "emails": [{"email": "admin@home.example", "primary": True, "verified": True, "visibility": None},
               {"email": "admin@example.com", "primary": False, "verified": False, "visibility": None}],
}  # fmt: skip
GOOGLE_ANN = {
    "id": "1098", "email": "Ann@Example.com", "verified_email": True, "name": "Ann", "picture": "",
    "hd": "example.com",
}  # fmt: skip


@pytest.mark.parametrize(
    ("peer", "forwarded_for", "client"),
    [
        ("127.0.0.1", "10.1.2.3", "10.1.2.3"),  # a trusted proxy names its client
        ("127.0.0.1", "6.6.6.6, 10.1.2.3", "10.1.2.3"),  # the client's own entry, left of the proxy's
        ("127.0.0.1", "10.1.2.3, 127.0.0.1", "10.1.2.3"),  # two of our proxies in a row
        ("127.0.0.1", "[2001:db8::1]:443", "2001:db8::1"),
        ("127.0.0.1", "10.1.2.3:5555", "10.1.2.3"),
        ("127.0.0.1", "not-an-address", "127.0.0.1"),
        ("127.0.0.1", None, "127.0.0.1"),
        ("203.0.113.5", "127.0.0.1", "203.0.113.5"),  # anyone else: the peer, whatever it writes
        ("127.0.0.3", "10.1.2.3", "127.0.0.3"),
    ],
)
def test_the_client_is_the_peer_unless_a_trusted_proxy_names_it(
    peer: str, forwarded_for: str | None, client: str
) -> None:
    assert forwarded_client(peer, forwarded_for, LOOPBACK) == client


@pytest.mark.asyncio
async def test_uvicorn_trusting_everyone_does_not_hide_the_peer() -> None:
    """FORWARDED_ALLOW_IPS=*: uvicorn believes the header; the app still sees the peer, and decides
    the client by its own list."""
    seen: dict[str, Any] = {}

    async def app(scope: dict, receive: Any, send: Any) -> None:
        seen.update(scope)

    stack = PeerRecordingProxyHeaders(ClientAddresses(app, LOOPBACK), trusted_hosts="*")
    headers = [(b"x-forwarded-for", b"127.0.0.1"), (b"host", b"chat.example")]
    await stack({"type": "http", "client": ("203.0.113.5", 4000), "headers": headers}, None, None)
    assert seen[PEER_KEY] == ("203.0.113.5", 4000) and seen["client"] == ("203.0.113.5", 4000)
    trusted = [(b"x-forwarded-for", b"10.9.8.7")]
    await stack({"type": "websocket", "client": ("127.0.0.1", 4001), "headers": trusted}, None, None)
    assert seen[PEER_KEY] == ("127.0.0.1", 4001) and seen["client"] == ("10.9.8.7", 0)


def test_the_uvicorn_that_chainlit_configures_keeps_the_peer() -> None:
    record_peers()

    async def app(scope: dict, receive: Any, send: Any) -> None:
        pass

    config = uvicorn.Config(app, forwarded_allow_ips="*")
    config.load()
    assert isinstance(config.loaded_app, PeerRecordingProxyHeaders)


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1:8000", True), ("localhost:8000", True), ("LOCALHOST", True), ("[::1]:8000", True),
        ("[::1]", True), ("127.0.0.1", True), ("rebind.attacker.example:8000", False),
        ("localhost.attacker.example", False), ("127.0.0.1.nip.io:8000", False), ("localhost:80:80", False),
        ("[::1]evil:8000", False), ("", False), ("127.0.0.2:8000", False),
    ],
)  # fmt: skip
def test_loopback_host_names(host: str, loopback: bool) -> None:
    assert is_loopback_host(host) is loopback


def test_a_local_sign_in_is_a_browser_on_this_machine_without_a_proxy() -> None:
    here = {"host": "127.0.0.1:8000"}
    assert sign_in_problem("127.0.0.1", here) is None
    assert sign_in_problem("127.0.0.1", {**here, "origin": "http://127.0.0.1:8000"}) is None
    assert sign_in_problem("127.0.0.1", {"host": "evil.example:8000"})
    assert sign_in_problem("127.0.0.1", {**here, "origin": "http://evil.example"})
    assert sign_in_problem("127.0.0.1", {**here, "origin": "null"})
    assert sign_in_problem("10.0.0.2", here)
    for header in (
        "x-forwarded-for",
        "cf-connecting-ip",
        "true-client-ip",
        "x-forwarded-host",
        "via",
        "forwarded",
    ):
        assert sign_in_problem("127.0.0.1", {**here, header: "203.0.113.9"}), header
    assert origin_problem({"host": "localhost:8000"}) is None, "no Origin: not a browser's cross-site request"


# tests/system/security/test_local_mode.py's proxy headers, each alone on a request from this machine
PROXY_HEADERS = [
    ("X-Forwarded-For", "203.0.113.9"),
    ("CF-Connecting-IP", "203.0.113.9"),
    ("True-Client-IP", "203.0.113.9"),
    ("X-Forwarded-Host", "chat.public.example"),
    ("X-Forwarded-Proto", "https"),
    ("Forwarded", "for=203.0.113.9"),
    ("X-Real-IP", "203.0.113.9"),
    ("Via", "1.1 edge-proxy"),
]


@pytest.mark.asyncio
@pytest.mark.parametrize(("name", "value"), PROXY_HEADERS, ids=[name for name, _ in PROXY_HEADERS])
async def test_a_proxied_request_is_not_signed_in_locally(name: str, value: str) -> None:
    """What /auth/header calls in local mode (`SignIn.header`, with the request's headers as Starlette
    gives them): the same request without the header signs in as the local user."""
    local = SignIn(Settings.from_env({}), "local", None)
    current_request.set(SignInRequest(address="127.0.0.1", peer="127.0.0.1"))
    here = {"host": "127.0.0.1:8000"}
    assert await local.header(Headers(headers=here)) is not None
    assert await local.header(Headers(headers={**here, name: value})) is None, name


@pytest.mark.asyncio
async def test_local_mode_signs_in_through_the_token_only_when_told_to(tmp_path: Path) -> None:
    token = load_or_create_token(tmp_path)
    assert load_or_create_token(tmp_path) == token and (tmp_path / "local-token").stat().st_mode & 0o077 == 0
    strict = SignIn(Settings.from_env({"LOCAL_TOKEN_REQUIRED": "true"}), "local", None, local_token=token)
    current_request.set(SignInRequest(address="127.0.0.1", peer="127.0.0.1"))
    assert await strict.header({"host": "127.0.0.1:8000"}) is None
    assert strict.local_user_for_token("wrong") is None and strict.local_user_for_token("") is None
    user = strict.local_user_for_token(token)
    assert user is not None and user.identifier == "local"
    assert (
        SignIn(Settings.from_env({}), "password", None, local_token=token).local_user_for_token(token) is None
    )
    assert f"/auth/local?token={token}" in token_banner("127.0.0.1", 8000, token, required=False)


@pytest_asyncio.fixture(loop_scope="module")
async def store(tmp_path: Path) -> AsyncIterator[AccountStore]:
    engine = create_engine(Settings.from_env({"DATA_DIR": str(tmp_path)}))
    await migrate(engine)
    yield AccountStore(engine)
    await engine.dispose()


class FakeOrgs:
    """GitHub's answer about organisations, as a table: (org, token) -> active member."""

    def __init__(self, members: set[tuple[str, str]]) -> None:
        self.members = members
        self.asked: list[tuple[str, str]] = []

    async def __call__(self, org: str, token: str) -> bool:
        self.asked.append((org, token))
        return (org, token) in self.members


def oauth_sign_in(store: AccountStore | None, orgs: FakeOrgs | None = None, **env: str) -> SignIn:
    return SignIn(Settings.from_env(env), "oauth", store, org_member=orgs or FakeOrgs(set()))


async def github(sign_in: SignIn, raw: dict, token: str = "gho_admin") -> User | None:
    default = User(identifier=raw["login"], metadata={"image": raw["avatar_url"], "provider": "github"})
    return await sign_in.oauth("github", token, raw, default)


async def google(sign_in: SignIn, raw: dict) -> User | None:
    default = User(identifier=raw["email"], metadata={"image": raw["picture"], "provider": "google"})
    return await sign_in.oauth("google", "ya29.token", raw, default)


@pytest.mark.asyncio(loop_scope="module")
async def test_a_provider_user_never_becomes_the_local_account_of_the_same_name(store: AccountStore) -> None:
    await store.add("admin", "the admins password", "admin")
    nobody_allowed = oauth_sign_in(store)
    assert await github(nobody_allowed, GITHUB_ADMIN) is None, "no allowlist: refused"
    everyone = oauth_sign_in(store, OAUTH_ALLOWED_USERS="*")
    user = await github(everyone, GITHUB_ADMIN)
    assert user is not None and user.identifier == "github:admin" and user.metadata["role"] == "user"
    assert (await google(everyone, GOOGLE_ANN)).identifier == "google:ann@example.com"  # type: ignore[union-attr]


@pytest.mark.asyncio(loop_scope="module")
async def test_the_allowlist_decides_on_verified_addresses_named_users_and_organisations(
    store: AccountStore,
) -> None:
    by_domain = oauth_sign_in(store, OAUTH_ALLOWED_DOMAINS="example.com")
    assert await github(by_domain, GITHUB_ADMIN) is None, "admin@example.com is not verified on GitHub"
    assert (await google(by_domain, GOOGLE_ANN)) is not None
    assert await google(by_domain, {**GOOGLE_ANN, "verified_email": False}) is None
    assert await google(by_domain, {**GOOGLE_ANN, "email": "ann@example.com.evil.example"}) is None
    named = oauth_sign_in(store, OAUTH_ALLOWED_USERS="github:ADMIN, google:someone@else.example")
    assert (await github(named, GITHUB_ADMIN)) is not None and await google(named, GOOGLE_ANN) is None
    orgs = FakeOrgs({("acme", "gho_admin")})
    by_org = oauth_sign_in(store, orgs, OAUTH_ALLOWED_ORGS="Acme, other")
    assert (await github(by_org, GITHUB_ADMIN)) is not None and orgs.asked == [("acme", "gho_admin")]
    assert await github(by_org, GITHUB_ADMIN, token="gho_not_a_member") is None
    assert await google(by_org, GOOGLE_ANN) is None, "GitHub organisations admit GitHub users only"
    assert verified_emails(GITHUB_ADMIN) == ["admin@home.example"]
    with pytest.raises(SettingsError):
        OAuthAllowlist.from_settings(Settings.from_env({"OAUTH_ALLOWED_USERS": "octocat"}))


@pytest.mark.asyncio(loop_scope="module")
async def test_an_administrators_link_is_the_only_way_into_a_local_account(store: AccountStore) -> None:
    await store.add("bob", "bobs long password")
    sign_in = oauth_sign_in(store)  # no allowlist: the link alone lets him in
    raw = {**GITHUB_ADMIN, "login": "Bob-GH"}
    assert await github(sign_in, raw) is None
    assert await store.link("Bob", "GitHub:Bob-GH") == "github:bob-gh"
    user = await github(sign_in, raw)
    assert user is not None and user.identifier == "bob" and user.metadata["role"] == "user"
    assert await store.links() == [("github:bob-gh", "bob", (await store.links())[0][2])]
    with pytest.raises(AccountError):
        await store.link("admin", "github:bob-gh")  # one identity, one account
    with pytest.raises(AccountError):
        await store.link("nobody", "github:x")
    with pytest.raises(AccountError):
        await store.link("bob", "bob-gh")  # not a provider identity
    with pytest.raises(AccountError):
        await store.add("github:mallory", "a password for it")  # provider names sign in at their provider
    await store.remove("bob")
    assert await github(sign_in, raw) is None, "a removed account's link lets no one in"
    await store.unlink("github:bob-gh")
    with pytest.raises(AccountError):
        await store.unlink("github:bob-gh")


def test_local_mode_answers_a_foreign_name_only_when_signed_in(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHAINLIT_AUTH_SECRET", "s" * 48)
    cookie = f"access_token={create_jwt(User(identifier='local'))}"
    here, elsewhere = {"host": "127.0.0.1:8000"}, {"host": "rebind.attacker.example:8000"}

    def refused(path: str, headers: dict[str, str], peer: str = "127.0.0.1") -> bool:
        return refusal({"type": "http", "path": path, PEER_KEY: (peer, 1)}, headers) is not None

    assert not refused("/", here) and refused("/", elsewhere) and refused("/healthz", elsewhere)
    assert not refused("/project/threads", {**elsewhere, "cookie": cookie}), "signed in through the token"
    assert refused("/", {**elsewhere, "cookie": "access_token=forged"})
    assert refused("/user", {**here, "cookie": cookie, "origin": "http://evil.example"}), (
        "another site's page"
    )
    assert not refused("/auth/local", elsewhere), "the token route checks the token itself"
    assert not refused("/v1/models", {**elsewhere, "origin": "http://localhost:3000"}), (
        "API keys are not ambient"
    )
    assert refused("/v1/models", here, peer="10.0.0.2") and refused("/", here, peer="10.0.0.2")
