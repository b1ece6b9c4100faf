"""ChatGPT's `conversations.json` export: a list of conversations, each a tree of nodes (`mapping`)
whose shown branch runs from `current_node` up to the root through `parent`.

Only that branch is imported (edits and regenerated answers on other branches are left out), and of
it what the person read as the conversation, by the user and the assistant: text; the words of a
message with pictures or voice (`multimodal_text`: its string parts and voice transcripts, with a
note such as "[1 image not imported]" for the rest); the code the assistant ran (`code` sent to
`python`, as a fenced block). Skipped: system and tool messages (code output `execution_output`,
browsing quotes `tether_quote`), calls to other tools (searches, image prompts, memory), and what
ChatGPT hid from the conversation (custom instructions `user_editable_context`, memory, reasoning).
A cycle, a missing node or a branch longer than the message limit refuses the file. The file's ids
are only used to walk the tree, never stored.
"""

from __future__ import annotations

import re
from typing import Any

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


def is_chatgpt(document: Any) -> bool:
    """A list of objects with a `mapping` (an empty list is not recognised as anything)."""
    return (
        isinstance(document, list)
        and bool(document)
        and isinstance(document[0], dict)
        and "mapping" in document[0]
    )


def read_chatgpt(document: list[Any], limits: ImportLimits) -> list[Conversation]:
    if len(document) > limits.max_conversations:
        raise BadImport(f"The file holds more than {limits.max_conversations:,} conversations.")
    conversations = [_conversation(item, number, limits) for number, item in enumerate(document, 1)]
    return check_counts(conversations, limits)


def _conversation(item: Any, number: int, limits: ImportLimits) -> Conversation:
    where = f"Conversation {number}"
    if not isinstance(item, dict) or not isinstance(item.get("mapping"), dict):
        raise BadImport(f'{where} must be an object with a "mapping" of messages.')
    messages = []
    for node in _branch(item["mapping"], item.get("current_node"), where, limits):
        message = _message(node, where, limits)
        if message is not None:
            messages.append(message)
    return Conversation(checked_title(item.get("title")), iso_time(item.get("create_time")), messages)


def _branch(mapping: dict[str, Any], current: Any, where: str, limits: ImportLimits) -> list[dict[str, Any]]:
    """The nodes from the root down to `current` (the branch ChatGPT showed)."""
    if current is None:  # no current node: the whole conversation has one branch at most, or nothing
        leaves = [key for key, node in mapping.items() if isinstance(node, dict) and not node.get("children")]
        if len(leaves) != 1:
            raise BadImport(f'{where} has no "current_node".')
        current = leaves[0]
    branch: list[dict[str, Any]] = []
    seen: set[str] = set()
    key = current
    while key is not None:
        if not isinstance(key, str) or key not in mapping or not isinstance(mapping[key], dict):
            raise BadImport(f'{where} refers to a message that is not in its "mapping".')
        if key in seen:
            raise BadImport(f"{where}'s messages form a cycle.")
        if len(branch) >= 2 * limits.max_messages + 2:  # system and tool nodes count too, but boundedly
            raise BadImport(f"{where} has more than {limits.max_messages:,} messages.")
        seen.add(key)
        branch.append(mapping[key])
        key = mapping[key].get("parent")
    return branch[::-1]


# What a `multimodal_text` part that is not text is called in the note that says it was left out.
ATTACHMENT_NAMES = {
    "image_asset_pointer": ("image", "images"),
    "audio_asset_pointer": ("voice recording", "voice recordings"),
    "real_time_user_audio_video_asset_pointer": ("video", "videos"),
}
OTHER_ATTACHMENT = ("attachment", "attachments")
CODE_RECIPIENTS = ("all", "python")  # code shown as the assistant's; others are tool calls


def _message(node: dict[str, Any], where: str, limits: ImportLimits) -> Message | None:
    """The node's message by the user or the assistant as the person read it; None for anything
    else (module docstring)."""
    message = node.get("message")
    if message is None:
        return None
    if not isinstance(message, dict):
        raise BadImport(f'{where}: a "message" must be an object.')
    author = message.get("author")
    content = message.get("content")
    role = author.get("role") if isinstance(author, dict) else None
    if role not in ("user", "assistant") or not isinstance(content, dict) or _hidden(message):
        return None
    text = _text(content, message.get("recipient") or "all", where)
    if text is None:
        return None
    check_message(role, text, limits, where)
    if not text.strip():
        return None
    return Message(role, text, iso_time(message.get("create_time")))


def _hidden(message: dict[str, Any]) -> bool:
    """ChatGPT did not show it in the conversation (custom instructions, memory)."""
    metadata = message.get("metadata")
    return isinstance(metadata, dict) and metadata.get("is_visually_hidden_from_conversation") is True


def _text(content: dict[str, Any], recipient: Any, where: str) -> str | None:
    """The content as text, or None when it is not kept (module docstring)."""
    kind = content.get("content_type")
    if kind == "code":
        code = content.get("text")
        if recipient not in CODE_RECIPIENTS or not isinstance(code, str) or not code.strip():
            return None
        return fenced(code, content.get("language"))
    if kind not in ("text", "multimodal_text") or recipient != "all":
        return None
    parts = content.get("parts")
    if not isinstance(parts, list):
        raise BadImport(f'{where}: a message\'s "parts" must be a list.')
    return _parts_text(parts)


def _parts_text(parts: list[Any]) -> str:
    """The string parts and voice transcripts, one a line, then a note of the objects left out."""
    texts: list[str] = []
    left_out: dict[tuple[str, str], int] = {}
    for part in parts:
        if isinstance(part, str):
            texts.append(part)
        elif not isinstance(part, dict):
            continue  # not a part ChatGPT writes: nothing a person saw
        elif part.get("content_type") == "audio_transcription":
            if isinstance(part.get("text"), str):
                texts.append(part["text"])
        else:
            kind = part.get("content_type")
            name = ATTACHMENT_NAMES.get(kind, OTHER_ATTACHMENT) if isinstance(kind, str) else OTHER_ATTACHMENT
            left_out[name] = left_out.get(name, 0) + 1
    text = "\n".join(texts)
    if left_out:
        text = f"{text}\n\n{not_imported(left_out)}" if text.strip() else not_imported(left_out)
    return text


def not_imported(counts: dict[tuple[str, str], int]) -> str:
    """The note of what a message held that was left out: "[1 image and 2 voice recordings not
    imported]"."""
    named = [f"{count} {one if count == 1 else many}" for (one, many), count in counts.items()]
    listed = named[0] if len(named) == 1 else ", ".join(named[:-1]) + " and " + named[-1]
    return f"[{listed} not imported]"


def fenced(code: str, language: Any) -> str:
    """`code` as a Markdown code block, its fence longer than any run of backticks inside."""
    fence = "`" * max(3, 1 + max(map(len, re.findall("`+", code)), default=0))
    tag = language if isinstance(language, str) and language.isidentifier() and language != "unknown" else ""
    return f"{fence}{tag}\n{code.strip(chr(10))}\n{fence}"
