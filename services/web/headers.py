"""What every response tells the browser: no framing (clickjacking), no content sniffing, no
referrer to other sites, a Content-Security-Policy; and the sign-in cookie is `Secure` over https.

Chainlit 2.12 sends none of these headers, and sets its cookies `Secure` only with
CHAINLIT_COOKIE_SAMESITE=none (chainlit/auth/cookie.py), so behind a TLS proxy the sign-in cookie
would also travel over plain http. Here each `Set-Cookie` gets `Secure` when the request came over
https: the scheme uvicorn sets from X-Forwarded-Proto when the proxy is trusted (FORWARDED_ALLOW_IPS,
loopback by default), or always when CHAINLIT_URL starts with https://.
The page's own inline scripts are allowed by their hashes (`page_policy`), not by 'unsafe-inline'.
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

ASGIApp = Callable[[MutableMapping[str, Any], Callable, Callable], Awaitable[None]]
Headers = list[tuple[bytes, bytes]]

SAFETY_HEADERS: Headers = [
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
]
_INLINE_SCRIPT = re.compile(r"<script(?![^>]*\bsrc\s*=)[^>]*>(.*?)</script>", re.DOTALL | re.IGNORECASE)


class SecurityHeaders:
    """Adds the safety headers to every HTTP response (a route's own CSP is kept), and `Secure` to
    its cookies over https (pure ASGI)."""

    def __init__(self, app: ASGIApp, content_security_policy: str, chainlit_url: str = "") -> None:
        self.app = app
        self.policy = content_security_policy.encode()
        self.always_secure = chainlit_url.strip().lower().startswith("https://")

    async def __call__(self, scope: MutableMapping[str, Any], receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        secure = self.always_secure or scope.get("scheme") == "https"

        async def send_with_headers(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": self.headers(message.get("headers", ()), secure)}
            await send(message)

        await self.app(scope, receive, send_with_headers)

    def headers(self, headers: Iterable[tuple[bytes, bytes]], secure: bool) -> Headers:
        """The response's headers with the safety headers it lacks, and Secure cookies if `secure`."""
        result = [
            (name, secure_cookie(value) if secure and name.lower() == b"set-cookie" else value)
            for name, value in headers
        ]
        present = {name.lower() for name, _ in result}
        if b"content-security-policy" not in present:
            result.append((b"content-security-policy", self.policy))
        result += [(name, value) for name, value in SAFETY_HEADERS if name not in present]
        return result


def secure_cookie(value: bytes) -> bytes:
    """A Set-Cookie value with the Secure attribute (added once)."""
    attributes = (part.strip().lower() for part in value.split(b";")[1:])
    return value if b"secure" in attributes else value + b"; Secure"


def page_policy(policy: str, html: str) -> str:
    """`policy` with the hashes of `html`'s inline scripts added to script-src (made from default-src
    when the policy has no script-src), so the page's own inline scripts run and no others."""
    hashes = " ".join(
        "'sha256-" + base64.b64encode(hashlib.sha256(body.encode()).digest()).decode() + "'"
        for body in _INLINE_SCRIPT.findall(html)
    )
    directives = [d.strip() for d in policy.split(";") if d.strip()]
    names = [d.split()[0].lower() for d in directives]
    if not hashes:
        return policy
    if "script-src" in names:
        index = names.index("script-src")
        directives[index] = f"{directives[index]} {hashes}"
    elif "default-src" in names:
        index = names.index("default-src")
        sources = directives[index].split()[1:]
        directives.insert(index + 1, " ".join(["script-src", *sources, hashes]))
    return "; ".join(directives)
