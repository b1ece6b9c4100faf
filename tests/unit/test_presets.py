"""Presets from a client are checked before they are kept: types, sizes, ranges, control characters;
the chat commands parse as written and refuse what is wrong with a clear answer."""

from __future__ import annotations

import asyncio
import math

import pytest

from services.chat.commands import command_of
from services.config import Settings
from services.presets.commands import describe, run_preset_command
from services.presets.validation import (
    PRESETS_MAX_NAME_CHARS,
    PresetError,
    clean_defaults,
    clean_name,
    clean_text,
)

SETTINGS = Settings.from_env({}).replace(presets_max_template_chars=50)


def test_a_panel_default_is_kept_with_each_value_checked() -> None:
    values = {"temperature": 0.7, "top_p": 1, "max_new_tokens": 128, "system_prompt": "  Be brief.\nAlways. "}
    assert clean_defaults(values, SETTINGS) == {
        "temperature": 0.7, "top_p": 1.0, "max_new_tokens": 128, "system_prompt": "Be brief.\nAlways.",
    }  # fmt: skip
    assert clean_defaults({}, SETTINGS) == {}


@pytest.mark.parametrize(
    ("values", "said"),
    [
        ([1, 2], "must be an object"),
        ("temperature=1", "must be an object"),
        ({"temperature": "hot"}, "temperature must be a number"),
        ({"temperature": True}, "temperature must be a number"),
        ({"temperature": math.nan}, "temperature must be a number"),
        ({"temperature": math.inf}, "temperature must be a number"),
        ({"temperature": 2.5}, "between 0 and 2"),
        ({"top_p": 0}, "between 0.01 and 1"),
        ({"max_new_tokens": 10**9}, "max_new_tokens must be between"),
        ({"system_prompt": 42}, "system prompt must be text"),
        ({"system_prompt": "x" * 51}, "longer than 50"),
        ({"system_prompt": "bell\x07"}, "control characters"),
        ({"system_prompt": "escape\x1b[31m"}, "control characters"),
        ({"model_path": "/etc/passwd"}, "Unknown settings: model_path"),
        ({"__proto__": {}}, "Unknown settings"),
    ],
)
def test_a_bad_default_is_refused_saying_why(values: object, said: str) -> None:
    with pytest.raises(PresetError, match=said):
        clean_defaults(values, SETTINGS)


def test_texts_and_names_are_bounded_and_clean() -> None:
    assert clean_text(" tab\tand\nnewline ", 50, "text") == "tab\tand\nnewline"
    for bad in (None, b"bytes", ["list"], "", "   ", "nul\x00", "del\x7f", "x" * 51):
        with pytest.raises(PresetError):
            clean_text(bad, 50, "text")
    assert clean_name(" Translate ") == "Translate"
    for bad in ("two\nlines", "/stats", "x" * (PRESETS_MAX_NAME_CHARS + 1), 7, "tab\there"):
        with pytest.raises(PresetError):
            clean_name(bad)


def test_preset_commands_are_told_apart_from_messages() -> None:
    assert command_of("/preset save").word == "/preset" and command_of("  /template list").word == "/template"
    assert command_of("/presets") is None and command_of("what is a /preset?") is None


def test_without_a_database_or_sign_in_nothing_is_kept() -> None:
    answer = asyncio.run(run_preset_command(None, "alice", "/preset save", {"temperature": 1.0}))
    assert "nothing is kept" in answer


def test_a_default_is_described_in_one_line() -> None:
    assert "No default saved" in describe({})
    said = describe({"temperature": 0.5, "max_new_tokens": 64, "system_prompt": "Be brief."})
    assert said == "Your default: temperature 0.5, max_new_tokens 64; system prompt: «Be brief.»."
