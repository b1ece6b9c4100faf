"""Whom sign-in trusts, without a model: the TCP peer against X-Forwarded-For (uvicorn's own
middleware, then ours)."""

from __future__ import annotations

from typing import Any

import pytest
import uvicorn

from services.accounts.addresses import forwarded_client, networks
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
