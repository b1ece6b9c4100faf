"""Web edge settings: which other web origins may use the app, the page's Content-Security-Policy,
how large a request may be, and how much text a client may store."""

from __future__ import annotations

from dataclasses import dataclass

from services.config.fields import SettingsError, setting

# Chainlit 2.12's page: its scripts, styles, fonts and images come from the app itself (the fonts and
# KaTeX's CSS too: services/web/page_assets.py); its two inline scripts are allowed by their hashes,
# added per page. Inline styles are the UI kit's (React sets them); images from other sites, which
# a prompt-injected answer could use to send the conversation away, are not loaded.
DEFAULT_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data: blob:; font-src 'self' data:; media-src 'self' data: blob:; "
    "connect-src 'self'; worker-src 'self' blob:; object-src 'none'; base-uri 'self'; "
    "form-action 'self'; frame-ancestors 'none'"
)


@dataclass(frozen=True)
class WebSettings:
    """What browsers and HTTP clients may do at the app's edge, and how much they may send and store."""

    max_request_body_bytes: int = setting(
        1_048_576,
        "MAX_REQUEST_BODY_BYTES",
        "Largest HTTP request body on every route but the upload (MAX_UPLOAD_BYTES) and the API "
        "(API_MAX_BODY_BYTES); a larger one gets 413 before it is read into memory. The page's own "
        "requests (sign-in, rename, feedback, the sidebar) are a few KB.",
        1024,
    )
    max_feedback_comment_chars: int = setting(
        4000,
        "MAX_FEEDBACK_COMMENT_CHARS",
        "Longest comment with a thumbs up or down; a longer one is refused (400).",
        1,
    )
    allowed_origins: str = setting(
        "",
        "ALLOWED_ORIGINS",
        "Other web origins (comma-separated, e.g. https://intranet.example.com) whose pages may use the "
        "app with their visitor's cookie: CORS, the chat socket and every POST, PUT, PATCH and DELETE "
        "outside /v1. The app's own origin is always "
        "allowed: CHAINLIT_URL when set; else http(s)://localhost, 127.0.0.1 and [::1] on its port "
        "and the host the request names. Set CHAINLIT_URL behind a proxy that changes the Host.",
    )
    content_security_policy: str = setting(
        DEFAULT_CSP,
        "CONTENT_SECURITY_POLICY",
        "Content-Security-Policy of every response (the page's own inline scripts are added to "
        "script-src by their hashes). Widen it only for what you add (e.g. img-src for OAuth avatars).",
    )


DEFAULT_PORTS = {"http": 80, "https": 443}


def normalize_origin(text: str) -> str | None:
    """`scheme://host[:port]` as browsers send it in Origin (lower case, no default port), or None
    when `text` is not an http(s) origin (e.g. "null", a path, a wildcard)."""
    scheme, separator, rest = text.strip().partition("://")
    scheme = scheme.lower()
    if not separator or scheme not in DEFAULT_PORTS or not rest or any(c in rest for c in "/?#@*\\ "):
        return None
    host, port = rest.lower(), None
    if not host.endswith("]") and ":" in host:
        host, _, port_text = host.rpartition(":")
        if not port_text.isdigit() or not 0 < int(port_text) < 65536:
            return None
        port = int(port_text)
    if not host or host in ("[]", ""):
        return None
    return f"{scheme}://{host}" if port in (None, DEFAULT_PORTS[scheme]) else f"{scheme}://{host}:{port}"


def parse_origins(env: str, text: str) -> list[str]:
    """The comma-separated origins of `env`, normalized; raises SettingsError naming a bad one."""
    origins = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        origin = normalize_origin(part.rstrip("/"))
        if origin is None:
            raise SettingsError(f"{env}: {part!r} is not an origin like https://chat.example.com")
        origins.append(origin)
    return origins
