"""One person's presets in the database (tables `user_presets` and `prompt_templates`, migration 13).

Not in Chainlit's `users.metadata`: Chainlit's data layer overwrites that column with the sign-in
callback's metadata at every sign-in, and the page is sent it. Every query names the person, so one
person never reads or changes another's presets; values are checked (validation.py) before they are
written and again when read back (a row edited by hand cannot reach a session unchecked).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from services.config import Settings
from services.presets.validation import PresetError, clean_defaults, clean_name, clean_text


@dataclass(frozen=True)
class Template:
    """A named prompt a person saved: offered as a starter on a new chat."""

    name: str
    text: str


def _now() -> str:
    return datetime.now(UTC).isoformat()


class PresetStore:
    """Default chat settings and prompt templates, per person (their user identifier)."""

    def __init__(self, engine: AsyncEngine, settings: Settings) -> None:
        self.engine = engine
        self.settings = settings

    async def defaults(self, who: str) -> dict[str, Any]:
        """The person's default chat settings (empty: none saved)."""
        async with self.engine.connect() as connection:
            row = (
                await connection.execute(
                    text("SELECT settings FROM user_presets WHERE user_identifier = :who"), {"who": who}
                )
            ).first()
        if row is None:
            return {}
        try:
            return clean_defaults(json.loads(row[0]), self.settings)
        except (ValueError, PresetError):
            return {}

    async def save_defaults(self, who: str, values: object) -> dict[str, Any]:
        """Keep `values` (checked) as the person's default; return what was kept."""
        cleaned = clean_defaults(values, self.settings)
        async with self.engine.begin() as connection:
            await connection.execute(
                text(
                    "INSERT INTO user_presets (user_identifier, settings, updated_at) "
                    "VALUES (:who, :s, :now) ON CONFLICT (user_identifier) "
                    "DO UPDATE SET settings = :s, updated_at = :now"
                ),
                {"who": who, "s": json.dumps(cleaned), "now": _now()},
            )
        return cleaned

    async def clear_defaults(self, who: str) -> bool:
        async with self.engine.begin() as connection:
            result = await connection.execute(
                text("DELETE FROM user_presets WHERE user_identifier = :who"), {"who": who}
            )
        return bool(result.rowcount)

    async def templates(self, who: str) -> list[Template]:
        """The person's templates by name (at most PRESETS_MAX_TEMPLATES)."""
        async with self.engine.connect() as connection:
            rows = await connection.execute(
                text(
                    "SELECT name, text FROM prompt_templates WHERE user_identifier = :who ORDER BY name "
                    "LIMIT :n"
                ),
                {"who": who, "n": self.settings.presets_max_templates},
            )
            return [Template(name, body) for name, body in rows]

    async def save_template(self, who: str, name: object, body: object) -> Template:
        """Keep a template (a new one, or a new text for a name the person has); refused past
        PRESETS_MAX_TEMPLATES."""
        template = Template(
            clean_name(name),
            clean_text(body, self.settings.presets_max_template_chars, "template text"),
        )
        async with self.engine.begin() as connection:
            count = (
                await connection.execute(
                    text("SELECT COUNT(*) FROM prompt_templates WHERE user_identifier = :who AND name <> :n"),
                    {"who": who, "n": template.name},
                )
            ).scalar_one()
            if count >= self.settings.presets_max_templates:
                raise PresetError(
                    f"You keep {count} templates, the most allowed ({self.settings.presets_max_templates}); "
                    "delete one first (/template delete NAME)."
                )
            await connection.execute(
                text(
                    "INSERT INTO prompt_templates (user_identifier, name, text, created_at) "
                    "VALUES (:who, :n, :t, :now) ON CONFLICT (user_identifier, name) DO UPDATE SET text = :t"
                ),
                {"who": who, "n": template.name, "t": template.text, "now": _now()},
            )
        return template

    async def delete_template(self, who: str, name: object) -> bool:
        cleaned = clean_name(name)
        async with self.engine.begin() as connection:
            result = await connection.execute(
                text("DELETE FROM prompt_templates WHERE user_identifier = :who AND name = :n"),
                {"who": who, "n": cleaned},
            )
        return bool(result.rowcount)
