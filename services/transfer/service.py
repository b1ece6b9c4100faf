"""Export, import and share links for one process, over the history's database engine: what the
routes (services/web/transfer_routes.py) and the chat commands (services/web/transfer_chat.py) call.
Every operation names the person it acts for, and touches only that person's conversations."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy.ext.asyncio import AsyncEngine

from services.audit.log import AuditLog
from services.config import Settings
from services.transfer import shares, store
from services.transfer.archive import (
    ARCHIVE_END,
    BadImport,
    Conversation,
    ImportLimits,
    archive_item,
    archive_start,
    archive_text,
)
from services.transfer.events import transfer_event
from services.transfer.limits import ImportGate, ImportQuota, Ticket
from services.transfer.markdown import to_markdown
from services.transfer.reader import read_in_child
from services.transfer.reading import ImportRead

logger = logging.getLogger(__name__)

FORMATS = {"md": "text/markdown; charset=utf-8", "json": "application/json"}


@dataclass(frozen=True)
class ExportFile:
    filename: str
    media_type: str
    text: str


@dataclass(frozen=True)
class Imported:
    thread_ids: list[str]
    titles: list[str]
    empty_messages: int = 0  # left out of the file
    empty_conversations: int = 0  # left out: nothing but empty messages


def file_stem(title: str) -> str:
    """A file name from a conversation's title: letters, digits, - and _ only."""
    return re.sub(r"[^A-Za-z0-9_-]+", "-", title).strip("-")[:60] or "conversation"


class Transfers:
    def __init__(self, engine: AsyncEngine, settings: Settings, audit: AuditLog | None = None) -> None:
        self.engine = engine
        self.settings = settings
        self.audit = audit  # export, import and share events are recorded there
        self.limits = ImportLimits(
            settings.import_max_conversations,
            settings.import_max_messages,
            settings.import_max_message_chars,
            settings.import_max_stored_messages,
            settings.import_max_stored_bytes,
        )
        self.gate = ImportGate(engine, ImportQuota.from_settings(settings))  # who may import now

    async def export_one(self, thread_id: str, owner: str, format_name: str) -> ExportFile | None:
        """One conversation of `owner` as Markdown or as an archive of one; None if not theirs."""
        conversation = await store.owned_conversation(self.engine, thread_id, owner)
        if conversation is None or format_name not in FORMATS:
            return None
        transfer_event(self.audit, "conversation.exported", owner, thread_id=thread_id, format=format_name)
        if format_name == "md":
            body = to_markdown(conversation)
        else:
            body = archive_text([conversation], datetime.now(UTC))
        return ExportFile(f"{file_stem(conversation.title)}.{format_name}", FORMATS[format_name], body)

    async def export_all(self, owner: str) -> AsyncIterator[str]:
        """The archive of `owner`'s most recently active EXPORT_MAX_CONVERSATIONS conversations, a
        conversation at a time."""
        limit = self.settings.export_max_conversations
        ids, total = await store.owned_thread_ids(self.engine, owner, limit)
        left_out = total - len(ids)
        transfer_event(self.audit, "conversations.exported", owner, conversations=len(ids), left_out=left_out)
        yield archive_start(datetime.now(UTC), max(0, total - len(ids)))
        written = 0
        for thread_id in ids:
            conversation = await store.owned_conversation(self.engine, thread_id, owner)
            if conversation is not None:  # deleted meanwhile
                yield archive_item(written, conversation)
                written += 1
        yield ARCHIVE_END

    async def import_file(self, owner: str, data: bytes, assistant_name: str) -> Imported:
        """Store the file's conversations as `owner`'s (all or none), within the import limits;
        BadImport (ImportLimited for a limit of the person's) says what is wrong. The file is read in a
        child process and stored in short batches: the chat goes on meanwhile. `assistant_name`: the
        author of imported answers (the page's assistant)."""
        try:
            async with self.gate.admitted(owner) as ticket:
                read = await self._read(ticket, data)
                try:
                    ids = await store.import_conversations(
                        self.engine, owner, read.conversations, assistant_name
                    )
                except BaseException as error:
                    await self._finish(
                        ticket, "partly stored" if isinstance(error, store.PartlyStored) else "failed"
                    )
                    raise
                await self._finish(ticket, "stored")
        except BadImport as error:
            transfer_event(self.audit, "conversations.import_refused", owner, reason=str(error)[:200])
            raise
        transfer_event(
            self.audit, "conversations.imported", owner, conversations=len(ids), messages=read.stored_messages
        )
        titles = [c.title for c in read.conversations]
        return Imported(ids, titles, read.empty_messages, read.empty_conversations)

    async def _read(self, ticket: Ticket, data: bytes) -> ImportRead:
        """The file read by a child process and counted against the person's day; refused: recorded."""
        try:
            if len(data) > self.settings.import_max_bytes:
                raise BadImport(f"The file is larger than {self.settings.import_max_bytes:,} bytes.")
            read = await read_in_child(data, self.limits)
            await self.gate.reserve(ticket, read)
        except BadImport:
            await self._finish(ticket, "refused")
            raise
        return read

    async def _finish(self, ticket: Ticket, state: str) -> None:
        """Record how the import ended; a failure to is logged, never hides what happened to the file."""
        try:
            await asyncio.shield(self.gate.finish(ticket, state))
        except Exception as error:
            logger.warning("import %s ended %s, not recorded: %s", ticket.id, state, type(error).__name__)

    async def share(self, thread_id: str, owner: str) -> shares.NewShare | None:
        created = await shares.create_share(self.engine, thread_id, owner, self.settings.share_ttl_days)
        if created is not None:
            expires_at = created.expires_at
            transfer_event(self.audit, "share.created", owner, thread_id=thread_id, expires_at=expires_at)
        return created

    async def revoke(self, thread_id: str, owner: str) -> int | None:
        """End the links to `owner`'s conversation; None when it is not theirs (or missing)."""
        if not await store.owns(self.engine, thread_id, owner):
            return None
        revoked = await shares.revoke_shares(self.engine, thread_id, owner)
        transfer_event(self.audit, "share.revoked", owner, thread_id=thread_id, links=revoked)
        return revoked

    async def shared(self, token: str) -> Conversation | None:
        conversation = await shares.shared_conversation(self.engine, token)
        if conversation is not None:
            transfer_event(self.audit, "share.opened", None)
        return conversation
