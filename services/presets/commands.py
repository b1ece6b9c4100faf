"""`/preset ...` and `/template ...` in the chat: a person manages their own presets.

/preset save            the settings in effect become the default of every new conversation
/preset show            what the default is
/preset clear           back to the service's defaults
/template save NAME | TEXT    keep a prompt under NAME (a starter on every new chat)
/template delete NAME
/template list
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.presets.store import PresetStore
from services.presets.validation import PresetError

USAGE = (
    "Presets: `/preset save` (the settings in effect become your default), `/preset show`, "
    "`/preset clear`; templates: `/template save NAME | TEXT`, `/template delete NAME`, `/template list`."
)


def describe(values: Mapping[str, Any]) -> str:
    if not values:
        return "No default saved: new conversations start with the service's settings."
    parts = [f"{key} {values[key]:g}" for key in ("temperature", "top_p", "max_new_tokens") if key in values]
    prompt = values.get("system_prompt")
    shown = f"; system prompt: «{prompt[:200]}{'…' if len(prompt) > 200 else ''}»" if prompt else ""
    return "Your default: " + ", ".join(parts) + shown + "."


async def run_preset_command(
    store: PresetStore | None, who: str | None, text: str, in_effect: Mapping[str, Any]
) -> str:
    """The answer to one command; `in_effect` is the conversation's chat settings now."""
    if store is None or who is None:
        return "Presets need sign-in and a database; nothing is kept here."
    words = text.strip().split(maxsplit=2)
    action = words[1] if len(words) > 1 else ""
    try:
        if words[0] == "/preset":
            return await _preset(store, who, action, in_effect)
        return await _template(store, who, action, words[2] if len(words) > 2 else "")
    except PresetError as error:
        return f"Not kept: {error}"


async def _preset(store: PresetStore, who: str, action: str, in_effect: Mapping[str, Any]) -> str:
    if action == "save":
        saved = await store.save_defaults(who, dict(in_effect))
        return "Saved. " + describe(saved) + " New conversations start with it."
    if action == "show":
        return describe(await store.defaults(who))
    if action == "clear":
        cleared = await store.clear_defaults(who)
        return "Default cleared." if cleared else "No default was saved."
    return USAGE


async def _template(store: PresetStore, who: str, action: str, rest: str) -> str:
    if action == "save":
        name, bar, body = rest.partition("|")
        if not bar:
            return "Give a name and a text: `/template save NAME | TEXT`."
        template = await store.save_template(who, name, body)
        return f"Template «{template.name}» saved: it is offered on every new chat."
    if action == "delete":
        deleted = await store.delete_template(who, rest)
        return "Deleted." if deleted else "No template of that name."
    if action == "list":
        templates = await store.templates(who)
        if not templates:
            return "No templates saved."
        return "\n".join(
            f"- **{t.name}**: {t.text[:120]}{'…' if len(t.text) > 120 else ''}" for t in templates
        )
    return USAGE
