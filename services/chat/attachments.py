"""Uploaded files become the session's document: read, bounded by tokens, deleted from disk."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from services.chat.session import ChatSession, SessionDocument
from services.config import Settings
from services.documents.errors import DocumentError
from services.documents.extract import Document, extract_document
from services.engine import ChatEngine

T = TypeVar("T")


@dataclass(frozen=True)
class AttachResult:
    """What became of an upload: the document (if any file was readable) and what to tell the user."""

    document: SessionDocument | None
    errors: tuple[str, ...]
    notes: tuple[str, ...]


class DocumentThreads:
    """Runs document work (reading files, counting tokens) in threads, at most `count` at once.

    vLLM's tokenizer pool lends every calling thread its own deep copy of the tokenizer and keeps
    each copy it ever made (services/memory/word_caches.py): unbounded threads would grow it by
    ~8 MB per new peak of concurrent callers, for the life of the process.
    """

    def __init__(self, count: int) -> None:
        self._slots = asyncio.Semaphore(count)

    async def run(self, function: Callable[..., T], *args: object) -> T:
        async with self._slots:
            return await asyncio.to_thread(function, *args)


class Attachments:
    """Turns uploads into session documents within the document settings' limits."""

    def __init__(self, engine: ChatEngine, settings: Settings) -> None:
        self.engine = engine
        self.settings = settings
        self.threads = DocumentThreads(settings.document_threads)  # the chat service's plans use them too

    async def attach(self, session: ChatSession, files: list[tuple[str, str]]) -> AttachResult:
        """Read uploaded files (path, name) into the session's document; delete the files.

        Unreadable files are reported, not fatal. A new upload replaces the
        session's previous document, and the user is told.
        """
        s = self.settings
        readable: list[Document] = []
        errors: list[str] = []
        notes: list[str] = []
        if len(files) > s.max_files_per_message:
            notes.append(f"Only the first {s.max_files_per_message} files were read.")
        for path, name in files[: s.max_files_per_message]:
            try:
                readable.append(await self.threads.run(self._read_file, path, name))
            except DocumentError as error:
                errors.append(f"**{name}**: {error}")
        for path, _ in files:
            with contextlib.suppress(OSError):
                os.remove(path)
        if not readable:
            return AttachResult(None, tuple(errors), tuple(notes))
        name = ", ".join(doc.name for doc in readable)
        text = "\n\n".join(
            doc.text if len(readable) == 1 else f"## {doc.name}\n\n{doc.text}" for doc in readable
        )
        notes.extend(note for doc in readable for note in doc.notes)
        text, tokens, cut_note = await self.threads.run(self._bounded_by_tokens, text)
        if cut_note:
            notes.append(cut_note)
        if session.document is not None:
            notes.append(f"«{session.document.name}» is put aside: questions now go to «{name}».")
        session.document = SessionDocument(name=name, text=text, tokens=tokens)
        return AttachResult(session.document, tuple(errors), tuple(notes))

    @staticmethod
    def discard(files: list[tuple[str, str]]) -> None:
        """Delete uploads that will not be read (their turn was refused); already gone is fine."""
        for path, _ in files:
            with contextlib.suppress(OSError):
                os.remove(path)

    def _read_file(self, path: str, name: str) -> Document:
        s = self.settings
        try:
            with open(path, "rb") as file:
                data = file.read(s.max_upload_bytes + 1)
        except OSError:
            raise DocumentError(
                f"'{name}' could not be read on the server; please upload it again."
            ) from None
        if len(data) > s.max_upload_bytes:
            raise DocumentError(f"'{name}' is larger than the {s.max_upload_bytes // 2**20} MB upload limit.")
        return extract_document(
            data,
            name,
            max_pages=s.max_document_pages,
            max_docx_uncompressed_bytes=s.max_docx_uncompressed_bytes,
            max_chars=s.max_document_chars,
        )

    def _bounded_by_tokens(self, text: str) -> tuple[str, int, str | None]:
        """Cut a document to MAX_DOCUMENT_TOKENS; return text, its tokens and a note if cut."""
        limit = self.settings.max_document_tokens
        ids = self.engine.tokenizer.encode(text, add_special_tokens=False)
        if len(ids) <= limit:
            return text, len(ids), None
        kept = self.engine.tokenizer.decode(ids[:limit])
        return (
            kept,
            limit,
            (
                f"The document has {len(ids):,} tokens; only its first {limit:,} tokens "
                f"(about {len(kept.split()):,} words) were used."
            ),
        )
