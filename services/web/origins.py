"""Which web origins may use the app from a browser, with the visitor's cookie: the app's own, and
ALLOWED_ORIGINS.

Chainlit 2.12 allows every origin: its CORSMiddleware takes `allow_origins` from
`.chainlit/config.toml` (["*"] when the key is missing) with credentials, so any site may read what
its visitors' cookies fetch; and it creates the socket.io server with `cors_allowed_origins=[]`,
which turns engine.io's Origin check off, so any site's page may open the chat socket as its visitor
(cross-site WebSocket hijacking). Here both get one policy:
- CORS: only the app's own origins and ALLOWED_ORIGINS get an allow header (Chainlit's middleware is
  rebuilt with that list; the config file's value is ignored, with a warning when it is not empty);
- the socket: a handshake whose Origin is not allowed is refused; one without Origin (not a browser:
  the harness, locust, scripts) is let through, since it carries no visitor's cookie by accident.
The app's own origin is CHAINLIT_URL's when set. Otherwise its loopback names on its port, and the
origin whose host the request names in Host (a browser sets both, so only a page served by this
server matches: a cross-site page does not). A page under another name that resolves to this
machine (a tunnel, DNS rebinding) holds no cookie for that name unless it signed in there: in local
mode only with the install's token (services/web/local_access.py refuses foreign names otherwise).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from chainlit.config import config as chainlit_config
from chainlit.server import sio
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware

from services.accounts.addresses import is_loopback
from services.config import SettingsError
from services.config.web import DEFAULT_PORTS, normalize_origin, parse_origins

logger = logging.getLogger(__name__)

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")
WILDCARD_HOSTS = ("0.0.0.0", "::", "")


@dataclass(frozen=True)
class OriginPolicy:
    """The origins allowed by name, and whether the request's own Host counts as one more."""

    origins: frozenset[str]
    same_host: bool = False

    def allows(self, origin: str | None, host: str | None) -> bool:
        """True when a page on `origin` may use the app; `host` is the request's Host header."""
        normalized = normalize_origin(origin) if origin else None
        if normalized is None:
            return False
        if normalized in self.origins:
            return True
        if not self.same_host or host is None:
            return False
        return _authority(normalized) == _host_authority(host, normalized)


def _authority(origin: str) -> str:
    return origin.partition("://")[2]


def _host_authority(host: str, origin: str) -> str:
    """The Host header as an origin's authority: lower case, the origin scheme's default port dropped."""
    host = host.strip().lower()
    default = f":{DEFAULT_PORTS[origin.partition('://')[0]]}"
    return host[: -len(default)] if host.endswith(default) else host


def origin_policy(bind_host: str, port: int, chainlit_url: str, allowed_origins: str) -> OriginPolicy:
    """The policy for a server bound to `bind_host`:`port` (see the module's docstring)."""
    extra = set(parse_origins("ALLOWED_ORIGINS", allowed_origins))
    if chainlit_url.strip():
        own = normalize_origin(_origin_part(chainlit_url))
        if own is None:
            raise SettingsError(f"CHAINLIT_URL={chainlit_url!r} does not start with an http(s) origin")
        return OriginPolicy(frozenset({own, *extra}))
    host = bind_host.strip().lower()
    names = list(LOOPBACK_NAMES)
    if host not in WILDCARD_HOSTS and not is_loopback(host):
        names.append(f"[{host}]" if ":" in host else host)
    local = {normalize_origin(f"{scheme}://{name}:{port}") for scheme in DEFAULT_PORTS for name in names}
    return OriginPolicy(frozenset({o for o in local if o} | extra), same_host=True)


def _origin_part(url: str) -> str:
    scheme, _, rest = url.strip().partition("://")
    return f"{scheme}://{rest.split('/', 1)[0]}"


def install_origin_policy(app: Any, policy: OriginPolicy) -> None:
    """Rebuild Chainlit's CORS middleware with the policy's origins and check Origin on the socket."""
    if chainlit_config.project.allow_origins:
        logger.warning(
            ".chainlit/config.toml allow_origins=%s is ignored: list other origins in ALLOWED_ORIGINS",
            chainlit_config.project.allow_origins,
        )
    replaced = 0
    for index, entry in enumerate(app.user_middleware):
        if entry.cls is CORSMiddleware:
            app.user_middleware[index] = Middleware(
                CORSMiddleware,
                allow_origins=sorted(policy.origins),
                allow_credentials=True,
                allow_methods=["*"],
                allow_headers=["*"],
            )
            replaced += 1
    assert replaced == 1, "Chainlit's CORS middleware moved"
    sio.eio.cors_allowed_origins = _socket_check(policy)


def _socket_check(policy: OriginPolicy) -> Any:
    told = False

    def allowed(origin: str | None, environ: Mapping[str, Any]) -> bool:
        # Also asked without an Origin (for CORS headers; such a request is let through anyway).
        nonlocal told
        if not origin or policy.allows(origin, environ.get("HTTP_HOST")):
            return bool(origin)
        if not told:  # once: a page behind a proxy that changes the Host needs CHAINLIT_URL
            told = True
            logger.warning(
                "chat socket refused for origin %.200r (not the app's own: set CHAINLIT_URL, "
                "or ALLOWED_ORIGINS); later refusals are not logged",
                origin,
            )
        return False

    return allowed
