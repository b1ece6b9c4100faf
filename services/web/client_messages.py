"""What the page may send on the socket, rebuilt from a client's payload (pure logic, socket_guard.py
applies it).

Chainlit 2.12 builds the stored message from the client's `client_message` payload as it is
(`Message.from_dict`): its `type` (an "assistant_message" is stored as the assistant's), `metadata`
(ours marks the model's own answers, services/history/resume.py ANSWER_METADATA), `name`, `parentId`,
`command`, `modes`, `language`. Chainlit 2.12's page sends a user message as
`{"id": uuid4, "threadId": "", "type": "user_message", "name": <user>, "output": text,
"createdAt": iso, "metadata": {"location": page URL}, "command": <a command the app offered>,
"modes": <the app's modes>}` with `fileReferences: [{"id": file id}]`. This app offers no modes, and
its commands (services/chat/commands.py) are read as typed: a command picked from the page's `/`
menu becomes the words it stands for (`command` "export", output "json" -> "/export json"), so it
is stored, resumed, exported and answered as the typed one; a command the app does not offer is
dropped. A message is rebuilt from its id, that text, the page's location and its file references;
everything else is the server's.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from chainlit.utils import utc_now

from services.chat.commands import typed
from services.history.data_layer import is_uuid

MAX_LOCATION_CHARS = 2048  # the page's URL, kept in the message's metadata as the page sends it
TOO_LONG = "message_too_long"
MALFORMED = "message_malformed"


class MessageRefused(ValueError):
    """A socket event that will not be handled; `str()` is what the sender reads, `reason` is logged."""

    def __init__(self, reason: str, text: str) -> None:
        super().__init__(text)
        self.reason = reason


@dataclass(frozen=True)
class SocketRules:
    """What one message may hold, and which chat settings (id -> kind: float, str, bool) the app offers."""

    max_message_chars: int
    max_files: int
    chat_settings: Mapping[str, type]


def _text(message: Mapping[str, Any], rules: SocketRules) -> str:
    """The message's text, a command picked from the menu written out in front; refused when too long."""
    text = message.get("output")
    if not isinstance(text, str):
        raise MessageRefused(MALFORMED, "This message cannot be read (it has no text).")
    text = typed(message.get("command"), text) or text
    if len(text) > rules.max_message_chars:
        raise MessageRefused(
            TOO_LONG,
            f"Your message has {len(text):,} characters; the limit is {rules.max_message_chars:,}. "
            "It was not sent: please shorten it, or attach it as a file.",
        )
    return text


def _message_id(message: Mapping[str, Any]) -> str:
    value = message.get("id")
    if not is_uuid(value) or uuid.UUID(value).version != 4:
        raise MessageRefused(MALFORMED, "This message cannot be read (its id is not one the page makes).")
    return value


def _file_references(payload: Mapping[str, Any], rules: SocketRules) -> list[dict[str, str]]:
    references = payload.get("fileReferences") or []
    if not isinstance(references, list) or not all(
        isinstance(reference, dict) and is_uuid(reference.get("id")) for reference in references
    ):
        raise MessageRefused(MALFORMED, "This message cannot be read (its attachments are not the page's).")
    if len(references) > rules.max_files:
        raise MessageRefused(MALFORMED, f"At most {rules.max_files} file(s) can be sent with one message.")
    return [{"id": reference["id"]} for reference in references]


def page_message(payload: Any, rules: SocketRules, author: str) -> dict[str, Any]:
    """The `client_message` payload rebuilt as the page sends it: a user message by `author`;
    raise MessageRefused when it is too long or not what the page sends."""
    if not isinstance(payload, dict) or not isinstance(payload.get("message"), dict):
        raise MessageRefused(MALFORMED, "This message cannot be read.")
    message = payload["message"]
    text = _text(message, rules)
    message_id = _message_id(message)
    metadata = message.get("metadata")
    location = metadata.get("location") if isinstance(metadata, dict) else None
    kept = {"location": location} if isinstance(location, str) and len(location) <= MAX_LOCATION_CHARS else {}
    rebuilt = {
        "id": message_id,
        "threadId": "",
        "type": "user_message",
        "name": author,
        "output": text,
        "createdAt": utc_now(),
        "metadata": kept,
    }
    return {"message": rebuilt, "fileReferences": _file_references(payload, rules)}


def edited_message(payload: Any, rules: SocketRules) -> dict[str, Any]:
    """The `edit_message` payload with what Chainlit's handler reads: the message's id and new text."""
    if not isinstance(payload, dict) or not isinstance(payload.get("message"), dict):
        raise MessageRefused(MALFORMED, "This edit cannot be read.")
    message = payload["message"]
    return {"message": {"id": _message_id(message), "output": _text(message, rules)}}


def _of_kind(value: Any, kind: type | None, max_chars: int) -> bool:
    if kind is float:
        return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if kind is str:
        return isinstance(value, str) and len(value) <= max_chars
    return kind is bool and isinstance(value, bool)


def kept_settings(values: Any, rules: SocketRules) -> dict[str, Any]:
    """The chat settings the app offers, with values of their kind; other keys and values are dropped."""
    if not isinstance(values, dict):
        return {}
    return {
        key: value
        for key, value in values.items()
        if isinstance(key, str) and _of_kind(value, rules.chat_settings.get(key), rules.max_message_chars)
    }
