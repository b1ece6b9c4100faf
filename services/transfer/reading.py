"""One imported file to conversations: which format it is, read by that format's reader."""

from __future__ import annotations

from services.transfer.archive import (
    BadImport,
    Conversation,
    ImportLimits,
    Message,
    is_archive,
    parse_json,
    read_archive,
    storable,
)
from services.transfer.chatgpt import is_chatgpt, read_chatgpt
from services.transfer.markdown import is_markdown_export, read_markdown

FORMATS = "this app's JSON archive or Markdown export, or ChatGPT's conversations.json"


def read_conversations(data: bytes, limits: ImportLimits) -> list[Conversation]:
    """The conversations in `data`, every text one the database can keep (`storable`); BadImport
    (with what to do) for anything else."""
    return [
        Conversation(
            storable(c.title),
            c.created_at,
            [Message(m.role, storable(m.content), m.created_at) for m in c.messages],
        )
        for c in _read(data, limits)
    ]


def _read(data: bytes, limits: ImportLimits) -> list[Conversation]:
    if not data.strip():
        raise BadImport("The file is empty.")
    if is_markdown_export(data):
        return read_markdown(data, limits)
    try:
        document = parse_json(data, limits.max_depth)
    except BadImport as error:
        raise BadImport(f"{error} Import takes {FORMATS}.") from None
    if is_archive(document):
        return read_archive(document, limits)
    if is_chatgpt(document):
        return read_chatgpt(document, limits)
    if isinstance(document, list) and not document:
        raise BadImport("The file holds no conversation.")
    raise BadImport(f"The file is JSON, but not {FORMATS}.")
