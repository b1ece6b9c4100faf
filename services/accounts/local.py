"""Local mode's rules: who is "a browser on this machine", and the install's token for anyone else.

Local mode signs in, without a form, the one person at this machine's browser. A loopback peer is
not enough to know that: a page under the attacker's own name that resolves to 127.0.0.1 (DNS
rebinding), a reverse proxy or tunnel on this machine (`ssh -R`, socat, nginx, cloudflared), and a
page of another site all reach the app from loopback. So a request is "local" only when
- its TCP peer is loopback,
- its Host is a loopback name (localhost, 127.0.0.1, [::1], any port): a rebinding page names the
  attacker's host, and a tunnel or proxy that keeps the Host names this machine's public name,
- its Origin, when a browser sends one, is that same loopback host: another site's page, or the
  page behind a proxy that rewrote the Host to 127.0.0.1 (nginx's default), gives itself away,
- and, to be signed in, it carries no header that proxies add (X-Forwarded-*, Forwarded, Via,
  X-Real-IP, CF-Connecting-IP, True-Client-IP, ...).
Anything else may sign in with the install's token (`/auth/local?token=...`, printed at start), as
Jupyter does; LOCAL_TOKEN_REQUIRED makes every sign-in need it.

The one case these rules cannot tell apart: a proxy on this machine that rewrites the Host to
loopback and adds no header, in front of a client that sends no Origin (a script, not a browser).
Anyone who puts the app behind a proxy must configure sign-in (AUTH_MODE).
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit

from services.accounts.addresses import is_loopback
from services.accounts.secret import load_or_create_secret

LOCAL_USER = "local"
TOKEN_FILE_NAME = "local-token"
TOKEN_PATH = "/auth/local"
LOOPBACK_HOST = re.compile(r"(localhost|127\.0\.0\.1|\[::1\])(:[0-9]{1,5})?")
# Headers a proxy, tunnel or CDN adds on the way; a browser at this machine sends none of them.
FORWARDING_HEADERS = (
    "forwarded",
    "via",
    "x-real-ip",
    "true-client-ip",
    "x-client-ip",
    "x-cluster-client-ip",
    "fastly-client-ip",
    "x-envoy-external-address",
    "x-proxyuser-ip",
)
FORWARDING_PREFIXES = ("x-forwarded-", "x-original-", "cf-")


def is_loopback_host(host: str | None) -> bool:
    """True for a Host header that names this machine by a loopback name, with or without a port."""
    return LOOPBACK_HOST.fullmatch((host or "").strip().lower()) is not None


def peer_problem(peer: str | None) -> str | None:
    """Why the TCP peer is not this machine, or None."""
    return None if is_loopback(peer) else f"it came from {peer}, not from this machine"


def host_problem(headers: Mapping[str, str]) -> str | None:
    """Why the Host is not a loopback name (DNS rebinding, a tunnel or proxy that kept the public name)."""
    host = headers.get("host", "")
    if is_loopback_host(host):
        return None
    return f"it names this machine {host[:100]!r}, not localhost, 127.0.0.1 or [::1]"


def origin_problem(headers: Mapping[str, str]) -> str | None:
    """Why the request's Origin (browsers send it on POSTs and sockets) is not the host it asks."""
    origin = headers.get("origin")
    if origin is None:
        return None
    parts = urlsplit(origin)
    if parts.scheme not in ("http", "https") or parts.netloc.lower() != headers.get("host", "").lower():
        return f"it comes from the page of {origin[:100]!r}"
    return None


def forwarding_header(headers: Mapping[str, str]) -> str | None:
    """The first header that says the request came through a proxy, or None."""
    for name in headers:
        lowered = name.lower()
        if lowered in FORWARDING_HEADERS or lowered.startswith(FORWARDING_PREFIXES):
            return lowered
    return None


def sign_in_problem(peer: str | None, headers: Mapping[str, str]) -> str | None:
    """Why a request may not sign in as the local user without the token; None when it may.
    `headers` has lower-case names (Starlette's Headers, or a dict)."""
    if problem := peer_problem(peer) or host_problem(headers) or origin_problem(headers):
        return problem
    if header := forwarding_header(headers):
        return f"it came through a proxy ({header})"
    return None


def load_or_create_token(data_dir: Path) -> str:
    """The install's token, kept in DATA_DIR/local-token (0600), created on first use."""
    return load_or_create_secret(data_dir, TOKEN_FILE_NAME, 32)


def token_matches(expected: str, offered: str | None) -> bool:
    return bool(offered) and hmac.compare_digest(expected.encode(), (offered or "").encode())


def token_banner(host: str, port: int, token: str, required: bool) -> str:
    """What the console shows at start in local mode: where to open the app, and the token's URL."""
    name = f"[{host}]" if ":" in host else host
    with_token = f"http://{name}:{port}{TOKEN_PATH}?token={token}"
    if required:
        return f"\nLocal mode: sign in by opening\n    {with_token}\n(LOCAL_TOKEN_REQUIRED=true)\n"
    return (
        f"\nLocal mode: open http://{name}:{port}/ in a browser on this machine.\n"
        f"Through a tunnel, a proxy or another name for this machine, sign in once with\n"
        f"    {with_token}\n(keep it private: it signs in as the local administrator)\n"
    )
