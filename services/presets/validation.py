"""Every preset value from a client checked before it is kept: types, sizes, control characters.

A default is the chat settings panel's values (CHAT_SETTING_KINDS); numbers must be finite and in the
panel's range, texts within their size and free of control characters (tabs and newlines allowed).
Anything else is refused with a `PresetError` that says what was wrong.
"""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Mapping
from typing import Any

from services.config import Settings

ALLOWED_CONTROLS = {"\n", "\t", "\r"}
PRESETS_MAX_NAME_CHARS = 60  # longest template name: a label on a starter button, not a text
# The settings panel's numbers (services/web/chat_page.py), with the range each may take.
NUMBER_RANGES: dict[str, tuple[float, float]] = {"temperature": (0.0, 2.0), "top_p": (0.01, 1.0)}


class PresetError(ValueError):
    """A preset value the service does not keep; the message says why."""


def clean_text(value: object, max_chars: int, what: str, *, allow_empty: bool = False) -> str:
    """`value` as a stripped text of at most `max_chars`, without control characters."""
    if not isinstance(value, str):
        raise PresetError(f"The {what} must be text.")
    text = value.strip()
    if not text and not allow_empty:
        raise PresetError(f"The {what} is empty.")
    if len(text) > max_chars:
        raise PresetError(f"The {what} is longer than {max_chars:,} characters.")
    if any(unicodedata.category(c) in ("Cc", "Cs") and c not in ALLOWED_CONTROLS for c in text):
        raise PresetError(f"The {what} contains control characters.")
    return text


def clean_name(value: object) -> str:
    """A template's name: one line of at most PRESETS_MAX_NAME_CHARS, not starting with '/'."""
    name = clean_text(value, PRESETS_MAX_NAME_CHARS, "template name")
    if "\n" in name or "\r" in name or "\t" in name:
        raise PresetError("The template name must be one line.")
    if name.startswith("/"):
        raise PresetError("The template name may not start with '/'.")
    return name


def _number(values: Mapping[str, Any], key: str, low: float, high: float) -> float:
    value = values[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise PresetError(f"The {key} must be a number.")
    if not low <= value <= high:
        raise PresetError(f"The {key} must be between {low:g} and {high:g}.")
    return float(value)


def clean_defaults(values: object, settings: Settings) -> dict[str, Any]:
    """The chat settings to keep as a person's default: only the panel's keys, each checked."""
    if not isinstance(values, Mapping):
        raise PresetError("The default settings must be an object.")
    unknown = sorted(
        str(key)[:40] for key in values if key not in (*NUMBER_RANGES, "max_new_tokens", "system_prompt")
    )
    if unknown:
        raise PresetError(f"Unknown settings: {', '.join(unknown)}.")
    cleaned: dict[str, Any] = {}
    for key, (low, high) in NUMBER_RANGES.items():
        if key in values:
            cleaned[key] = _number(values, key, low, high)
    if "max_new_tokens" in values:
        cleaned["max_new_tokens"] = int(_number(values, "max_new_tokens", 1, settings.max_new_tokens_limit))
    if "system_prompt" in values:
        cleaned["system_prompt"] = clean_text(
            values["system_prompt"], settings.presets_max_template_chars, "system prompt", allow_empty=True
        )
    return cleaned
