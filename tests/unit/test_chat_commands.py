"""The chat's commands (pure logic): one table feeds the page's `/` menu, /help and the dispatch, and a
command picked from the menu is read as the same words typed (on a real server:
tests/system/chat/test_commands.py)."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import chainlit
import pytest

from harness.chat_client import user_message_payload
from services.chat.commands import BY_WORD, COMMANDS, command_of, help_text, is_command, menu, offered, typed
from services.history.resume import history_from_steps
from services.web.chat_events import ChatEvents
from services.web.client_messages import MessageRefused, SocketRules, page_message

RULES = SocketRules(max_message_chars=20, max_files=1, chat_settings={})


@pytest.mark.parametrize(
    ("command", "text", "read_as"),
    [
        ("help", "", "/help"),
        ("preset", " show ", "/preset show"),
        ("export", "json", "/export json"),
        ("template", "save A | b", "/template save A | b"),
        ("rm", "-rf", "-rf"),  # no command of ours: dropped, the text is a message
        (["help"], "hi", "hi"),
    ],
)
def test_a_command_picked_from_the_menu_is_read_as_the_typed_one(command, text: str, read_as: str) -> None:
    payload = user_message_payload(text, command=command)
    rebuilt = page_message(payload, RULES, "alice")["message"]
    assert rebuilt["output"] == read_as and "command" not in rebuilt


def test_a_picked_command_counts_its_word_against_the_length_limit() -> None:
    with pytest.raises(MessageRefused):
        page_message(user_message_payload("x" * 15, command="template"), RULES, "alice")


def test_the_menu_lists_every_command_a_person_may_use_with_a_line_each() -> None:
    everyone = menu(offered(admin=False, sharing=True))
    assert [c["id"] for c in everyone] == [
        "help", "export", "import", "share", "preset", "template", "quota", "key",
    ]  # fmt: skip
    assert all(c["description"] and c["icon"] and c["button"] is False for c in everyone)
    assert "stats" in [c["id"] for c in menu(offered(admin=True, sharing=True))]
    assert "share" not in [c["id"] for c in menu(offered(admin=False, sharing=False))]


def test_each_menu_icon_is_one_chainlits_page_can_draw() -> None:
    """The page turns "share-2" into lucide's Share2 and draws nothing (a console warning) for a
    name it lacks."""
    bundle = next((Path(chainlit.__file__).parent / "frontend" / "dist" / "assets").glob("index-*.js"))
    text = bundle.read_text(encoding="utf-8")
    for command in COMMANDS:
        name = "".join(part.capitalize() for part in command.icon.split("-"))
        assert re.search(rf"[,{{]{name}:", text), command.icon


def test_help_names_every_offered_command_and_nothing_else() -> None:
    commands = offered(admin=False, sharing=False)
    said = help_text(commands)
    assert all(f"`{c.word}`" in said for c in commands)
    assert "/stats" not in said and "/share" not in said
    assert "`/preset` `save`, `show` or `clear`: Your default chat settings." in said


def test_every_command_has_an_answer() -> None:
    events = ChatEvents(SimpleNamespace(), SimpleNamespace(mode="password"))
    assert set(events.answers("/help", [])) == set(BY_WORD)


@pytest.mark.parametrize("text", ["/help", " /help me", "/quota", "/stats now", "/template list"])
def test_commands_never_reach_the_model_on_resume(text: str) -> None:
    assert is_command(text) and command_of(text) is not None
    steps = [{"type": "user_message", "output": text}, {"type": "user_message", "output": "Hello"}]
    assert history_from_steps(steps, 1000) == [{"role": "user", "content": "Hello"}]


@pytest.mark.parametrize("text", ["/helpful tips?", "help", "what does /help do?", ""])
def test_other_messages_are_not_commands(text: str) -> None:
    assert command_of(text) is None and typed("nope", text) is None


def test_the_readme_page_names_every_command() -> None:
    """chainlit.md, the page's Readme: what the product does and each command."""
    readme = (Path(__file__).parents[2] / "chainlit.md").read_text(encoding="utf-8")
    assert "## Commands" in readme and "## What you can do" in readme
    assert all(f"`{command.word}" in readme for command in COMMANDS)
