"""One imported file to conversations: which format it is, read by that format's reader, then what
is kept of it (empty messages and conversations left out) held to the file's storage caps.

Reading is plain CPU work with no I/O: the service runs it in a child process (reader.py)."""

from __future__ import annotations

from dataclasses import dataclass

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


@dataclass(frozen=True)
class ImportRead:
    """What a file brings: the conversations to store and what was left out of it."""

    conversations: list[Conversation]
    empty_messages: int = 0  # left out: nothing but white space
    empty_conversations: int = 0  # left out: no message left

    @property
    def stored_messages(self) -> int:
        return sum(len(c.messages) for c in self.conversations)

    @property
    def stored_bytes(self) -> int:
        return sum(conversation_bytes(c) for c in self.conversations)


def conversation_bytes(conversation: Conversation) -> int:
    """The text a conversation stores, in UTF-8 bytes: its title and its messages."""
    return len(conversation.title.encode()) + sum(len(m.content.encode()) for m in conversation.messages)


def read_import(data: bytes, limits: ImportLimits) -> ImportRead:
    """What `data` brings, every text one the database can keep (`storable`), within the limits; else
    BadImport, with what to do."""
    kept: list[Conversation] = []
    empty_messages = empty_conversations = 0
    for conversation in _read(data, limits):
        messages = [
            Message(m.role, storable(m.content), m.created_at)
            for m in conversation.messages
            if m.content.strip()
        ]
        empty_messages += len(conversation.messages) - len(messages)
        if messages:
            kept.append(Conversation(storable(conversation.title), conversation.created_at, messages))
        else:
            empty_conversations += 1
    read = ImportRead(kept, empty_messages, empty_conversations)
    check_stored(read, limits)
    return read


def read_conversations(data: bytes, limits: ImportLimits) -> list[Conversation]:
    """The conversations `read_import` keeps."""
    return read_import(data, limits).conversations


def check_stored(read: ImportRead, limits: ImportLimits) -> None:
    """BadImport when a file brings nothing to store, or more than one import may store."""
    if not read.conversations:
        raise BadImport("The file holds no message to import (empty messages are left out).")
    if read.stored_messages > limits.max_stored_messages:
        raise BadImport(
            f"The file holds {read.stored_messages:,} messages, and one import stores at most "
            f"{limits.max_stored_messages:,}: split it into smaller files."
        )
    if read.stored_bytes > limits.max_stored_bytes:
        raise BadImport(
            f"The file holds {read.stored_bytes:,} bytes of text, and one import stores at most "
            f"{limits.max_stored_bytes:,}: split it into smaller files."
        )


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
