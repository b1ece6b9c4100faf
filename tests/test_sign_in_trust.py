"""Whom sign-in trusts, without a model: the TCP peer against X-Forwarded-For (uvicorn's own
middleware, then ours) and local mode's rules."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import uvicorn
from chainlit.auth.jwt import create_jwt
from chainlit.user import User

from services.accounts.addresses import forwarded_client, networks
from services.accounts.local import (
    is_loopback_host,
    load_or_create_token,
    origin_problem,
    sign_in_problem,
    token_banner,
)
from services.accounts.sign_in import SignIn, SignInRequest, current_request
from services.config import Settings
from services.web.local_access import refusal
from services.web.peers import PEER_KEY, ClientAddresses, PeerRecordingProxyHeaders, record_peers

LOOPBACK = networks("127.0.0.1,::1", "TRUSTED_PROXY_ADDRESSES")


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
