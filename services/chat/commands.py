"""The chat's commands: one table of what a person may type (or pick from the page's `/` menu), what
each does in a line, and how a message is read as one. A command is answered by the service, never
the model: it stays out of the model's history, live, on resume and in an export. services/web
answers each (chat_events.py) and offers the menu.

A command picked from the menu arrives as its id (`export`) with the text typed after it; it is read
as the same words typed (`/export json`), so both behave, are stored and are shown after a reload
alike (`typed`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Command:
    """One command: its word, the lucide icon and line of the page's menu, what may follow it."""

    word: str  # "/export": the first word of a message
    icon: str  # a lucide icon name, as Chainlit's menu takes it
    description: str
    arguments: tuple[str, ...] = ()  # what may follow the word, as /help shows it
    admin_only: bool = False  # offered to administrators only
    needs_sharing: bool = False  # offered only with SHARING=true

    @property
    def id(self) -> str:
        """The id of the page's menu: the word without its slash (the menu shows it, and matches
        what is typed after `/` against it)."""
        return self.word[1:]


COMMANDS = (
    Command("/help", "circle-help", "What these commands do"),
    Command("/export", "download", "Download this conversation (Markdown, JSON) or all of yours"),
    Command(
        "/import",
        "upload",
        "Bring in conversations: attach this app's export or ChatGPT's conversations.json",
    ),
    Command(
        "/share",
        "share-2",
        "A read-only link to this conversation; revoke ends its links",
        ("revoke",),
        needs_sharing=True,
    ),
    Command("/preset", "sliders-horizontal", "Your default chat settings", ("save", "show", "clear")),
    Command(
        "/template",
        "file-text",
        "Prompts kept as a new chat's starters",
        ("save NAME | TEXT", "list", "delete NAME"),
    ),
    Command("/quota", "gauge", "Your tokens used and left, today and this month"),
    Command("/key", "key-round", "Your API keys for the /v1 API", ("new", "list", "revoke PREFIX")),
    Command("/stats", "chart-line", "The service's memory and load", admin_only=True),
)
BY_WORD = {command.word: command for command in COMMANDS}


def command_of(text: str) -> Command | None:
    """The command `text` is (its first word is one), else None."""
    words = text.strip().split(maxsplit=1)
    return BY_WORD.get(words[0]) if words else None


def is_command(text: str) -> bool:
    """Said to the service, never to the model."""
    return command_of(text) is not None


def typed(command_id: Any, text: str) -> str | None:
    """The words a command picked from the menu stands for (`export`, "json" -> "/export json");
    None when `command_id` is no command of ours."""
    command = BY_WORD.get(f"/{command_id}") if isinstance(command_id, str) else None
    return f"{command.word} {text.strip()}".rstrip() if command is not None else None


def offered(*, admin: bool, sharing: bool) -> list[Command]:
    """The commands a person may use here."""
    return [c for c in COMMANDS if (admin or not c.admin_only) and (sharing or not c.needs_sharing)]


def menu(commands: list[Command]) -> list[dict[str, Any]]:
    """Chainlit's command list (`emitter.set_commands`): the page's `/` menu, none a button."""
    return [{"id": c.id, "icon": c.icon, "description": c.description, "button": False} for c in commands]


def help_text(commands: list[Command]) -> str:
    """/help's answer: every command with what may follow it and what it does."""
    lines = [f"- `{c.word}`{_then(c.arguments)}: {c.description}." for c in commands]
    return (
        "Commands (type one, or `/` to pick from the menu); the model never sees them:\n\n"
        + "\n".join(lines)
        + "\n\n`/import` takes the file attached to the same message."
    )


def _then(arguments: tuple[str, ...]) -> str:
    """What may follow a command's word, as /help says it (e.g. " `save`, `show` or `clear`")."""
    quoted = [f"`{argument}`" for argument in arguments]
    if len(quoted) < 2:
        return "".join(" " + q for q in quoted)
    return " " + ", ".join(quoted[:-1]) + " or " + quoted[-1]
