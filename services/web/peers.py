"""Who is at the other end of each HTTP request and socket: the TCP peer, and the client.

`chainlit run` starts uvicorn with its ProxyHeadersMiddleware on: when the peer is in
FORWARDED_ALLOW_IPS (loopback by default, `*` in many containers), uvicorn replaces
scope["client"] with the address in X-Forwarded-For, which the client writes itself; the peer is
then lost, and "is this the auth proxy?" would be answered by the client. So:
- `record_peers` swaps uvicorn's middleware for a subclass that keeps the peer in scope[PEER_KEY]
  before uvicorn rewrites anything (call it before uvicorn builds its app: at app import);
- `ClientAddresses`, the app's outermost middleware, sets scope["client"] itself: the peer, or the
  client a trusted proxy names (TRUSTED_PROXY_ADDRESSES, and AUTH_PROXY_ADDRESSES in header mode).
  Chainlit and the per-address limits see that; trust decisions use `peer_of(scope)`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import uvicorn.config
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

from services.accounts.addresses import Network, forwarded_client, networks
from services.config import Settings

ASGIApp = Callable[[MutableMapping[str, Any], Callable, Callable], Awaitable[None]]
PEER_KEY = "vllm_chat.peer"  # the (host, port) that opened the connection, as uvicorn first saw it


class PeerRecordingProxyHeaders(ProxyHeadersMiddleware):
    """uvicorn's proxy-headers middleware, which first keeps the peer it is about to overwrite."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] in ("http", "websocket"):
            scope.setdefault(PEER_KEY, scope.get("client"))
        await super().__call__(scope, receive, send)


def record_peers() -> None:
    """Make the uvicorn that `chainlit run` is about to configure keep each connection's peer."""
    uvicorn.config.ProxyHeadersMiddleware = PeerRecordingProxyHeaders  # type: ignore[misc]


def peer_of(scope: MutableMapping[str, Any]) -> str | None:
    """The TCP peer's address (what trust is decided on)."""
    peer = scope.get(PEER_KEY, scope.get("client"))
    return peer[0] if peer else None


class ClientAddresses:
    """Sets scope["client"] to the peer, or to the client a trusted proxy names (pure ASGI)."""

    def __init__(self, app: ASGIApp, trusted: list[Network]) -> None:
        self.app = app
        self.trusted = trusted

    async def __call__(self, scope: MutableMapping[str, Any], receive: Callable, send: Callable) -> None:
        if scope["type"] in ("http", "websocket"):
            peer = scope.setdefault(PEER_KEY, scope.get("client"))
            forwarded = ", ".join(
                value.decode("latin-1")
                for name, value in scope.get("headers", ())
                if name == b"x-forwarded-for"
            )
            client = forwarded_client(peer[0] if peer else None, forwarded or None, self.trusted)
            if peer:
                scope["client"] = peer if client == peer[0] else (client, 0)
        await self.app(scope, receive, send)


def trusted_proxies(settings: Settings, mode: str) -> list[Network]:
    """TRUSTED_PROXY_ADDRESSES, and the auth proxies in header mode."""
    trusted = networks(settings.trusted_proxy_addresses, "TRUSTED_PROXY_ADDRESSES")
    if mode == "header":
        trusted += networks(settings.auth_proxy_addresses, "AUTH_PROXY_ADDRESSES")
    return trusted


def install_client_addresses(app: Any, settings: Settings, mode: str) -> None:
    """Keep peers, and decide clients; call last, so this is the outermost middleware."""
    record_peers()
    app.add_middleware(ClientAddresses, trusted=trusted_proxies(settings, mode))
