"""A conversation as Markdown that reads well and comes back through import unchanged.

Each message follows a marker line, an HTML comment that Markdown viewers hide:

    <!-- vllm-chat-export version=1 -->
    # Title
    <!-- message role=user created_at=2026-12-05T10:00:00.000Z -->
    **You**

    the text ...

A line of a message that itself starts like a marker gets one more backslash in front, taken off
again on import, so no text can pass for a marker. Lines end in "\n"; a file's "\r\n" and lone "\r"
are read as "\n".
"""

from __future__ import annotations

import re

from services.transfer.archive import (
    BadImport,
    Conversation,
    ImportLimits,
    Message,
    check_counts,
    check_message,
    checked_title,
    iso_time,
)

HEADER = "<!-- vllm-chat-export version=1 -->"
_MARKER = re.compile(r"^<!-- message role=(\w+)(?: created_at=(\S+))? -->$")
_MARKER_LIKE = re.compile(r"^(\\*)(<!-- (?:message |vllm-chat-export))")
_UNESCAPE = re.compile(r"^\\(\\*<!-- (?:message |vllm-chat-export))")
SPEAKERS = {"user": "**You**", "assistant": "**Assistant**"}


def _lines(text: str) -> list[str]:
    """The lines of `text` as a reader of the file sees them: "\r\n" and a lone "\r" end a line too."""
    return text.replace("\r\n", "\n").replace("\r", "\n").split("\n")


def _escaped(text: str) -> str:
    return "\n".join(_MARKER_LIKE.sub(r"\\\1\2", line) for line in _lines(text))


def _unescaped(lines: list[str]) -> str:
    return "\n".join(_UNESCAPE.sub(r"\1", line) for line in lines)


def to_markdown(conversation: Conversation) -> str:
    title = conversation.title.replace("\r", " ").replace("\n", " ")  # one line: the title line
    parts = [HEADER, f"# {_escaped(title)}", ""]
    for message in conversation.messages:
        stamp = f" created_at={message.created_at}" if message.created_at else ""
        parts += [
            f"<!-- message role={message.role}{stamp} -->",
            SPEAKERS[message.role],
            "",
            _escaped(message.content),
            "",
        ]
    return "\n".join(parts)


def is_markdown_export(data: bytes) -> bool:
    return data.lstrip(b"\xef\xbb\xbf").startswith(HEADER.encode())


def read_markdown(data: bytes, limits: ImportLimits) -> list[Conversation]:
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise BadImport("The file is not UTF-8 text.") from None
    lines = _lines(text)  # what is kept comes back the same from its export, whose lines end in "\n"
    title = lines[1][2:] if len(lines) > 1 and lines[1].startswith("# ") else ""
    conversation = Conversation(checked_title(_unescaped([title])))
    current: tuple[str, str | None] | None = None
    body: list[str] = []
    for line in [*lines[2:], "<!-- message role=end -->"]:
        marker = _MARKER.match(line)
        if marker is None:
            body.append(line)
            continue
        if current is not None:
            _add(conversation, current, body, limits)
        current = (marker.group(1), iso_time(marker.group(2)))
        body = []
    return check_counts([conversation], limits)


def _add(
    conversation: Conversation, current: tuple[str, str | None], body: list[str], limits: ImportLimits
) -> None:
    role, created_at = current
    if len(conversation.messages) >= limits.max_messages:
        raise BadImport(f"Conversation 1 has more than {limits.max_messages:,} messages.")
    if body[:1] == [SPEAKERS.get(role, "")] and body[1:2] == [""]:
        body = body[2:]
    if body[-1:] == [""]:
        body = body[:-1]  # the blank line written after each message
    text = _unescaped(body)
    check_message(role, text, limits, f"Message {len(conversation.messages) + 1}")
    conversation.messages.append(Message(role, text, created_at))
