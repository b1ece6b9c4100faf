"""A stored conversation back into a session: the turns the model saw, the chat settings, the document.

The model's history is rebuilt from the stored messages by the same rules that built it live:
every user message except commands and messages over MAX_MESSAGE_CHARS (both were answered
without the model), and the assistant messages marked as answers (ANSWER_METADATA; notices,
errors, reports and Chainlit's own "Task manually stopped." are not). Only the newest
MAX_HISTORY_MESSAGES are kept, and the prompt builder trims them to the token budget, as live.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from services.chat.commands import is_command
from services.engine import Message

ANSWER_KEY = "answer"
ANSWER_METADATA: dict[str, Any] = {ANSWER_KEY: True}  # on every reply that joins the model's history
CUT_ANSWER_NOTICE = (
    "Your last message has no complete answer: it was cut off when the page closed or the server "
    "answering it stopped. Send it again to get one."
)


def stored_dict(value: Any) -> dict[str, Any]:
    """Stored JSON comes back as text on SQLite and as text or a dict elsewhere."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return {}
    return value if isinstance(value, dict) else {}


def summary_request(document_name: str | None) -> str:
    """What the model was asked when a file came with an empty message."""
    return f"Summarize «{document_name}»." if document_name else "Summarize the document."


def history_from_steps(
    steps: Iterable[Mapping[str, Any]], max_message_chars: int, document_name: str | None = None
) -> list[Message]:
    """The model's messages of a stored conversation, oldest first."""
    return [message for message, _ in turns_from_steps(steps, max_message_chars, document_name)]


def turns_from_steps(
    steps: Iterable[Mapping[str, Any]], max_message_chars: int, document_name: str | None = None
) -> list[tuple[Message, str | None]]:
    """The model's messages of a stored conversation, oldest first, each with its step's id (where an
    edit or a regenerate cuts the conversation: services/chat/branch.py)."""
    messages: list[tuple[Message, str | None]] = []
    for step in steps:
        kind = step.get("type")
        text = step.get("output") or ""
        step_id = step.get("id")
        if kind == "user_message":
            if is_command(text) or len(text) > max_message_chars:
                continue
            messages.append(({"role": "user", "content": text or summary_request(document_name)}, step_id))
        elif kind == "assistant_message" and text and stored_dict(step.get("metadata")).get(ANSWER_KEY):
            messages.append(({"role": "assistant", "content": text}, step_id))
    return messages


def unanswered_message(steps: Iterable[Mapping[str, Any]]) -> str | None:
    """The newest user message when nothing the assistant said follows it (an answer is stored
    once it ends, so one that was cut off left nothing), else None; commands do not count."""
    last: str | None = None
    for step in steps:
        if step.get("type") == "user_message":
            text = step.get("output") or ""
            last = None if is_command(text) else text
        elif step.get("type") == "assistant_message":
            last = None
    return last


def chat_settings_of(thread: Mapping[str, Any]) -> dict[str, Any]:
    """The chat settings Chainlit stored with the conversation (at the last disconnect)."""
    return stored_dict(stored_dict(thread.get("metadata")).get("chat_settings"))
