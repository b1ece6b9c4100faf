"""ChatGPT's `conversations.json` export: a list of conversations, each a tree of nodes (`mapping`)
whose shown branch runs from `current_node` up to the root through `parent`.

Only that branch is imported (edits and regenerated answers on other branches are left out), only
the user's and the assistant's text messages (`content_type` "text": system and tool messages,
images and code runs are skipped), and a cycle, a missing node or a branch longer than the message
limit refuses the file. The file's ids are only used to walk the tree, never stored.
"""

from __future__ import annotations

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


def _message(node: dict[str, Any], where: str, limits: ImportLimits) -> Message | None:
    """The node's text message by the user or the assistant; None for anything else."""
    message = node.get("message")
    if message is None:
        return None
    if not isinstance(message, dict):
        raise BadImport(f'{where}: a "message" must be an object.')
    author = message.get("author")
    content = message.get("content")
    role = author.get("role") if isinstance(author, dict) else None
    if role not in ("user", "assistant") or not isinstance(content, dict):
        return None
    if content.get("content_type") != "text":
        return None
    parts = content.get("parts")
    if not isinstance(parts, list):
        raise BadImport(f'{where}: a message\'s "parts" must be a list.')
    texts = [part for part in parts if isinstance(part, str)]  # other parts: images, files
    text = "\n".join(texts)
    check_message(role, text, limits, where)
    if not text.strip():
        return None
    return Message(role, text, iso_time(message.get("create_time")))
