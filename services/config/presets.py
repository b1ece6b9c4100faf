"""Presets: what a person keeps as their defaults and saved prompts, and how much of it."""

from __future__ import annotations

from dataclasses import dataclass

from services.config.fields import setting


@dataclass(frozen=True)
class PresetSettings:
    """A person's default chat settings and named prompt templates, kept in the database."""

    presets_max_templates: int = setting(
        20,
        "PRESETS_MAX_TEMPLATES",
        "Named prompt templates a person may keep (offered as starters on a new chat); one more is "
        "refused until one is deleted.",
        0,
    )
    presets_max_template_chars: int = setting(
        4000,
        "PRESETS_MAX_TEMPLATE_CHARS",
        "Longest prompt template text, in characters (also the longest default system prompt).",
        1,
    )
