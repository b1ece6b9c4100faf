"""The app's own archive format, and the limits every imported file is held to.

An archive is one JSON object (docs/transfer.md):

    {"format": "vllm-chat-archive", "version": 1, "exported_at": "<ISO time>",
     "conversations": [{"title": "...", "created_at": "<ISO time>",
                        "messages": [{"role": "user" | "assistant", "content": "...",
                                      "created_at": "<ISO time>"}]}]}

A conversation's messages are what the model sees of it (the person's messages and the answers);
notices, errors and commands are not part of it. Nothing from the file is used as an id.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

ARCHIVE_FORMAT = "vllm-chat-archive"
ARCHIVE_VERSION = 1
ROLES = ("user", "assistant")
MAX_TITLE_CHARS = 200  # a longer title is cut (the sidebar cuts names too)
MAX_JSON_DEPTH = 64  # deeper files are refused before anything is read from them


class BadImport(ValueError):
    """A file that cannot be imported; its message is shown to the person as it is."""


@dataclass(frozen=True)
class ImportLimits:
    """What one file may hold (services/config/transfer.py says why each exists)."""

    max_conversations: int
    max_messages: int  # of one conversation, as the file has them (bounds the reading)
    max_message_chars: int
    max_stored_messages: int  # of the whole file, empty ones left out (bounds the writing)
    max_stored_bytes: int  # titles and messages in UTF-8, as stored
    max_depth: int = MAX_JSON_DEPTH


@dataclass(frozen=True)
class Message:
    role: str  # "user" or "assistant"
    content: str
    created_at: str | None = None  # ISO time from the file, when it had a valid one
    imported: bool = False  # stored by an import: the person's file said it, not this app


@dataclass
class Conversation:
    title: str
    created_at: str | None = None
    messages: list[Message] = field(default_factory=list)


def iso_time(value: Any) -> str | None:
    """An ISO time (UTC, trailing Z) from epoch seconds or an ISO string; None for anything else."""
    try:
        if isinstance(value, bool):
            return None
        if isinstance(value, int | float):
            if not math.isfinite(value) or not 0 <= value < 253402300800:  # before year 10000
                return None
            at = datetime.fromtimestamp(value, UTC)
        elif isinstance(value, str) and len(value) <= 40:
            at = datetime.fromisoformat(value.replace("Z", "+00:00"))
            at = at if at.tzinfo else at.replace(tzinfo=UTC)
        else:
            return None
        at = at.astimezone(UTC)  # 9999-12-31T23:59:59-14:00 is past the last time Python has
    except (ValueError, OverflowError, OSError):
        return None
    return at.replace(tzinfo=None).isoformat(timespec="milliseconds") + "Z"


def storable(text: str) -> str:
    """`text` as the database can keep it: a lone surrogate (JSON may carry `"\\ud800"`, UTF-8 cannot)
    and NUL (PostgreSQL's text refuses it) become U+FFFD."""
    if text.isascii() and "\x00" not in text:
        return text
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace").replace("\x00", "\ufffd")


def check_depth(document: Any, max_depth: int) -> None:
    """Raise BadImport when `document` nests arrays and objects deeper than `max_depth`."""
    pending: list[tuple[Any, int]] = [(document, 1)] if isinstance(document, dict | list) else []
    while pending:  # by hand: the document may be close to the recursion limit
        value, depth = pending.pop()
        if depth > max_depth:
            raise BadImport(f"The file is nested deeper than {max_depth} levels.")
        children = value.values() if isinstance(value, dict) else value
        pending.extend((child, depth + 1) for child in children if isinstance(child, dict | list))


def parse_json(data: bytes, max_depth: int) -> Any:
    """The JSON document of a file (UTF-8), depth-checked; BadImport when it is not JSON."""
    try:
        document = json.loads(data.decode("utf-8-sig"))
    except RecursionError:
        raise BadImport(f"The file is nested deeper than {max_depth} levels.") from None
    except (UnicodeDecodeError, ValueError):
        raise BadImport("The file is not JSON.") from None
    check_depth(document, max_depth)
    return document


def checked_title(value: Any, fallback: str = "Imported conversation") -> str:
    """The title stripped and cut (and stripped again: a cut may end on a space, which a second import
    would strip, so the title would not come back as it was kept)."""
    title = value.strip() if isinstance(value, str) else ""
    return (title or fallback)[:MAX_TITLE_CHARS].rstrip()


def check_message(role: Any, content: Any, limits: ImportLimits, where: str) -> None:
    if role not in ROLES:
        raise BadImport(f'{where}: the role must be "user" or "assistant".')
    if not isinstance(content, str):
        raise BadImport(f"{where}: the content must be text.")
    if len(content) > limits.max_message_chars:
        raise BadImport(f"{where}: a message is longer than {limits.max_message_chars:,} characters.")


def check_counts(conversations: list[Conversation], limits: ImportLimits) -> list[Conversation]:
    """The conversations, if there are some and none passes a limit; else BadImport."""
    if not conversations:
        raise BadImport("The file holds no conversation.")
    if len(conversations) > limits.max_conversations:
        raise BadImport(f"The file holds more than {limits.max_conversations:,} conversations.")
    for number, conversation in enumerate(conversations, 1):
        if len(conversation.messages) > limits.max_messages:
            raise BadImport(f"Conversation {number} has more than {limits.max_messages:,} messages.")
    return conversations


def is_archive(document: Any) -> bool:
    return isinstance(document, dict) and document.get("format") == ARCHIVE_FORMAT


def read_archive(document: dict[str, Any], limits: ImportLimits) -> list[Conversation]:
    """The conversations of an archive of ours; BadImport for a wrong version, type or size."""
    if document.get("version") != ARCHIVE_VERSION:
        raise BadImport(f"This archive's version is not one this app reads (it reads {ARCHIVE_VERSION}).")
    listed = document.get("conversations")
    if not isinstance(listed, list):
        raise BadImport('The archive\'s "conversations" must be a list.')
    if len(listed) > limits.max_conversations:
        raise BadImport(f"The file holds more than {limits.max_conversations:,} conversations.")
    return check_counts(
        [_conversation(item, number, limits) for number, item in enumerate(listed, 1)], limits
    )


def _conversation(item: Any, number: int, limits: ImportLimits) -> Conversation:
    where = f"Conversation {number}"
    if not isinstance(item, dict) or not isinstance(item.get("messages"), list):
        raise BadImport(f'{where} must be an object with a list of "messages".')
    if len(item["messages"]) > limits.max_messages:
        raise BadImport(f"{where} has more than {limits.max_messages:,} messages.")
    messages = []
    for index, message in enumerate(item["messages"], 1):
        if not isinstance(message, dict):
            raise BadImport(f"{where}, message {index} must be an object.")
        check_message(message.get("role"), message.get("content"), limits, f"{where}, message {index}")
        messages.append(Message(message["role"], message["content"], iso_time(message.get("created_at"))))
    return Conversation(checked_title(item.get("title")), iso_time(item.get("created_at")), messages)


def archive_head(exported_at: datetime) -> dict[str, Any]:
    return {
        "format": ARCHIVE_FORMAT,
        "version": ARCHIVE_VERSION,
        "exported_at": iso_time(exported_at.timestamp()),
    }


def conversation_json(conversation: Conversation) -> dict[str, Any]:
    return {
        "title": conversation.title,
        "created_at": conversation.created_at,
        "messages": [
            {"role": m.role, "content": m.content, "created_at": m.created_at} for m in conversation.messages
        ],
    }


ARCHIVE_END = "\n]}\n"


def archive_start(exported_at: datetime, left_out: int = 0) -> str:
    """The archive's first piece, up to its list of conversations (an export is streamed: this,
    then `archive_item` for each conversation, then ARCHIVE_END)."""
    head = archive_head(exported_at)
    if left_out:
        head["left_out"] = left_out  # conversations past EXPORT_MAX_CONVERSATIONS
    return json.dumps(head, ensure_ascii=False)[:-1] + ', "conversations": ['


def archive_item(index: int, conversation: Conversation) -> str:
    return ("," if index else "") + "\n" + json.dumps(conversation_json(conversation), ensure_ascii=False)


def archive_text(conversations: list[Conversation], exported_at: datetime) -> str:
    """A whole archive (one conversation's JSON export, tests)."""
    items = "".join(archive_item(index, c) for index, c in enumerate(conversations))
    return archive_start(exported_at) + items + ARCHIVE_END
