"""What an audit entry may hold: short names, and `details` as bounded JSON with nothing secret.

Every field is cut to a length; `details` is a flat mapping of short keys to scalars or short lists
of scalars (nesting is flattened to text), written as JSON of at most AUDIT_DETAILS_MAX_BYTES. A
value is masked when its key names a secret (password, token, secret, key, cookie, authorization);
in any value, an API key (`sk-vc-...`) is cut to its listed prefix, a URL's user and password
are dropped, and control characters are written as escapes (one entry, one line: log_lines.py).
Callers never pass secrets on purpose: this is the net under them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from services.audit.log_lines import one_line

ACTOR_CHARS = 128
ACTION_CHARS = 64
TARGET_CHARS = 256
ADDRESS_CHARS = 64
KEY_CHARS = 64
VALUE_CHARS = 512
AUDIT_DETAILS_MAX_BYTES = 4096  # JSON `details` of one entry at most; longer details are cut (and say so)
LIST_ITEMS = 20
MASK = "***"
# Words (split on `_`, `-`, `.` and spaces) that mark a key or a setting's name as secret.
SECRET_WORDS = frozenset(
    {"password", "passwd", "passphrase", "token", "secret", "key", "cookie", "authorization", "credentials"}
)
SECRET_NAMES = frozenset({"database_url"})  # may carry a password
_API_KEY = re.compile(r"(sk-vc-[A-Za-z0-9_-]{6})[A-Za-z0-9_-]+")
_URL_USER = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/@\s]+@")
_WORD_SPLIT = re.compile(r"[_\-.\s]+")


def is_secret_name(name: str) -> bool:
    """True for a key or setting named like a secret (ADMIN_PASSWORD, OPS_TOKEN, api-key, Cookie)."""
    lowered = name.strip().lower()
    return lowered in SECRET_NAMES or bool(SECRET_WORDS & set(_WORD_SPLIT.split(lowered)))


def scrub(text: str, limit: int = VALUE_CHARS) -> str:
    """`text` cut to `limit`, with API keys cut to their prefix, URL credentials dropped and control
    characters escaped (log_lines.py)."""
    text = one_line(_URL_USER.sub(r"\1***@", _API_KEY.sub(r"\1…", text)))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def short(value: Any, limit: int) -> str:
    """A name field (actor, action, target, address): text, scrubbed and cut; "" for None."""
    return "" if value is None else scrub(str(value), limit)


def _value(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, list | tuple | set | frozenset):
        items = [_value(item) for item in list(value)[:LIST_ITEMS]]
        flat = [item if not isinstance(item, list) else scrub(json.dumps(item)) for item in items]
        return flat + (["…"] if len(value) > LIST_ITEMS else [])
    if isinstance(value, Mapping):
        return scrub(json.dumps(clean(value), ensure_ascii=False))
    return scrub(str(value))


def clean(details: Mapping[str, Any] | None) -> dict[str, Any]:
    """`details` made safe to keep: keys cut, secret-named values masked, values scrubbed and cut."""
    cleaned: dict[str, Any] = {}
    for key, value in (details or {}).items():
        name = scrub(str(key), KEY_CHARS)
        cleaned[name] = MASK if is_secret_name(name) else _value(value)
    return cleaned


def details_json(details: Mapping[str, Any] | None, max_bytes: int) -> str:
    """`clean(details)` as JSON of at most `max_bytes` (UTF-8): entries that do not fit are left out
    and `"truncated": true` says so."""
    cleaned = clean(details)
    text = json.dumps(cleaned, ensure_ascii=False, separators=(",", ":"))
    if len(text.encode()) <= max_bytes:
        return text
    kept: dict[str, Any] = {"truncated": True}
    for key, value in cleaned.items():
        trial = {**kept, key: value}
        if len(json.dumps(trial, ensure_ascii=False, separators=(",", ":")).encode()) > max_bytes:
            continue
        kept = trial
    return json.dumps(kept, ensure_ascii=False, separators=(",", ":"))


def masked_settings(changed: Mapping[str, Any]) -> dict[str, Any]:
    """Settings (env name -> value) with every secret-named one masked, for the start-up entry."""
    return {name: MASK if is_secret_name(name) else value for name, value in changed.items()}
