"""Presets and model choice on the chat page: a person's default settings applied to a new chat, the
"save as my default" switch, `/preset` and `/template` answered, templates offered as starters, and
the served models offered as chat profiles (the model menu)."""

from __future__ import annotations

import logging
from typing import Any

import chainlit as cl

from services.config import Settings
from services.engine import model_names
from services.presets.commands import run_preset_command
from services.presets.store import PresetStore
from services.presets.validation import PresetError
from services.web.chainlit_state import current_user_identifier

logger = logging.getLogger(__name__)

SAVE_DEFAULT = "save_as_default"  # the settings panel's switch (chat_page.py)


async def default_settings(store: PresetStore | None) -> dict[str, Any]:
    """The signed-in person's default chat settings (empty: none, or no database)."""
    who = current_user_identifier()
    if store is None or who is None:
        return {}
    try:
        return await store.defaults(who)
    except Exception:  # the database is down: the service's defaults, and the chat goes on
        logger.warning("presets: could not read the default of a user", exc_info=True)
        return {}


async def save_if_asked(store: PresetStore | None, values: dict[str, Any], in_effect: dict[str, Any]) -> None:
    """The panel's switch is on: what is in effect becomes the person's default (told on the page)."""
    if values.get(SAVE_DEFAULT) is not True:
        return
    who = current_user_identifier()
    if store is None or who is None:
        await cl.ErrorMessage("Presets need sign-in and a database; nothing is kept here.").send()
        return
    try:
        await store.save_defaults(who, in_effect)
    except PresetError as error:
        await cl.ErrorMessage(f"Not kept as your default: {error}").send()
        return
    await _tell("Saved as your default: new conversations start with these settings.")


async def answer_preset_command(store: PresetStore | None, text: str, in_effect: dict[str, Any]) -> None:
    """Answer one `/preset` or `/template` message (the answer is not part of the model's history)."""
    await _tell(await run_preset_command(store, current_user_identifier(), text, in_effect))


async def starters(store: PresetStore | None, user: Any) -> list[cl.Starter]:
    """The person's prompt templates, offered on a new chat (none for anonymous people)."""
    who = getattr(user, "identifier", None)
    if store is None or not isinstance(who, str):
        return []
    try:
        templates = await store.templates(who)
    except Exception:
        logger.warning("presets: could not read the templates of a user", exc_info=True)
        return []
    return [cl.Starter(label=t.name, message=t.text) for t in templates]


def chat_profiles(settings: Settings, offered: list[str] | None = None) -> list[cl.ChatProfile]:
    """One chat profile per model offered when several are served (none: no model menu); `offered`:
    the models offered now (with ENGINE_URLS, what the vLLM servers list), else MODELS' names."""
    if offered is None:
        offered = model_names(settings) if len(settings.model_list) > 1 else []
    return [
        cl.ChatProfile(name=name, markdown_description=f"Answers come from **{name}**.", default=i == 0)
        for i, name in enumerate(offered)
    ]


async def _tell(text: str) -> None:
    await cl.Message(author="presets", content=text).send()
