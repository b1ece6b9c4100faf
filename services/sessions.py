"""Per-session chat state in a TTL-bounded LRU, and the lifetime of a chat turn.

`SessionStore.turn` is the one place that ties a turn to its session: it
cancels the previous turn (one generation in flight per session), registers
the running task so that stop, disconnect, eviction and expiry can cancel it,
and the engine aborts the request whenever a turn's stream ends early.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from cachetools import TTLCache

from services.config import Settings
from services.documents import Document, DocumentError, extract_document, rank_chunks, split_into_chunks
from services.engine import ChatEngine, Message, SamplingSettings, TokenBudgetError, token_budget
from services.summarizer import Progress, Summarizer, document_system_message

logger = logging.getLogger(__name__)

# Chat-template tokens around each message (role markers, separators), with a margin.
MESSAGE_OVERHEAD_TOKENS = 6
# How long a new turn waits for the turn it cancelled to finish its cleanup.
PREVIOUS_TURN_GRACE_SECONDS = 2.0


@dataclass
class SessionDocument:
    """The document a session talks about; freed with the session."""

    name: str
    text: str
    tokens: int
    chunks: tuple[str, ...] = ()  # retrieval chunks, made on first need
    chunk_tokens: int = 0


@dataclass(frozen=True)
class AttachResult:
    """What became of an upload: the document (if any file was readable) and what to tell the user."""

    document: SessionDocument | None
    errors: tuple[str, ...]
    notes: tuple[str, ...]


@dataclass
class ChatSession:
    """One user's conversation: settings, bounded history, the turn in flight."""

    session_id: str
    sampling: SamplingSettings
    system_prompt: str
    history: deque[Message]
    turn_task: asyncio.Task | None = None
    request_id: str | None = None
    document: SessionDocument | None = None

    def cancel_turn(self) -> asyncio.Task | None:
        """Cancel the running turn, if any; return it so the caller may await it."""
        task = self.turn_task
        if task is not None and not task.done():
            task.cancel()
            return task
        return None


@dataclass(frozen=True)
class TrimmedPrompt:
    """The messages sent to the engine and how many history messages were left out."""

    messages: list[Message]
    dropped_messages: int


class _SessionCache(TTLCache):
    """A TTLCache that hands every evicted or expired session to `on_drop`."""

    def __init__(self, maxsize: int, ttl: float, timer: Callable[[], float], on_drop: Callable) -> None:
        super().__init__(maxsize=maxsize, ttl=ttl, timer=timer)
        self._on_drop = on_drop

    def popitem(self):  # called by cachetools when the LRU bound is hit
        key, session = super().popitem()
        self._on_drop(session, "evicted")
        return key, session

    def expire(self, time=None):
        expired = super().expire(time)
        for _, session in expired:
            self._on_drop(session, "expired")
        return expired


class SessionStore:
    """All sessions of the process. Bounded by MAX_SESSIONS and SESSION_TTL_SECONDS."""

    def __init__(self, engine: ChatEngine, settings: Settings, timer: Callable[[], float] = time.monotonic):
        self.engine = engine
        self.settings = settings
        self.summarizer = Summarizer(engine, settings)
        self._sessions = _SessionCache(
            settings.max_sessions, settings.session_ttl_seconds, timer, self._release
        )
        self.dropped_total: dict[str, int] = {"evicted": 0, "expired": 0, "closed": 0}

    # --- lifecycle -----------------------------------------------------------
    def open(self, session_id: str) -> ChatSession:
        """The session for `session_id`, created on first use; marks it as used now."""
        self._sessions.expire()
        session = self._sessions.get(session_id)
        if session is None:
            s = self.settings
            session = ChatSession(
                session_id=session_id,
                sampling=SamplingSettings(s.temperature, s.top_p, s.max_new_tokens),
                system_prompt=s.system_prompt,
                history=deque(maxlen=s.max_history_messages),
            )
        self._sessions[session_id] = session  # (re)insert: refreshes TTL and LRU order
        return session

    def get(self, session_id: str) -> ChatSession | None:
        return self._sessions.get(session_id)

    def close(self, session_id: str) -> None:
        """Drop a session now (disconnect): cancel its turn, free its state."""
        session = self._sessions.pop(session_id, None)
        if session is not None:
            self._release(session, "closed")

    def expire(self) -> int:
        """Drop sessions idle for longer than the TTL; return how many."""
        return len(self._sessions.expire())

    def close_all(self) -> None:
        for session_id in list(self._sessions.keys()):
            self.close(session_id)

    def _release(self, session: ChatSession, reason: str) -> None:
        self.dropped_total[reason] += 1
        if session.cancel_turn() is not None:
            logger.info("session %s %s: cancelled its running turn", session.session_id[:8], reason)
        session.history.clear()
        session.document = None

    def __len__(self) -> int:
        return len(self._sessions)

    def turns_in_flight(self) -> int:
        return sum(1 for s in self._sessions.values() if s.turn_task is not None and not s.turn_task.done())

    # --- settings ------------------------------------------------------------
    def update_settings(self, session: ChatSession, values: Mapping[str, Any]) -> None:
        """Apply chat settings from the UI (any subset), clamped to the service limits.

        Unknown keys and values that are not numbers are ignored.
        """
        current = session.sampling

        def number(key: str, default: float, low: float, high: float) -> float:
            try:
                value = float(values.get(key, default))
            except (TypeError, ValueError):
                return default
            return min(max(value, low), high) if math.isfinite(value) else default

        session.sampling = SamplingSettings(
            temperature=number("temperature", current.temperature, 0.0, 2.0),
            top_p=number("top_p", current.top_p, 0.01, 1.0),
            max_new_tokens=int(
                number("max_new_tokens", current.max_new_tokens, 1, self.settings.max_new_tokens_limit)
            ),
        )
        if isinstance(values.get("system_prompt"), str):
            session.system_prompt = values["system_prompt"].strip() or self.settings.system_prompt

    # --- turns ---------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def turn(self, session: ChatSession) -> AsyncIterator[str]:
        """Run one turn in the current task; yields its engine request id.

        Cancels the session's previous turn first. Anything that cancels the
        task (Stop, disconnect, eviction, a newer message) ends the stream, and
        `ChatEngine.generate` aborts the engine request on the way out.
        """
        previous = session.cancel_turn()
        if previous is not None:
            await asyncio.wait([previous], timeout=PREVIOUS_TURN_GRACE_SECONDS)
        task = asyncio.current_task()
        request_id = f"chat-{session.session_id[:8]}-{uuid.uuid4().hex[:12]}"
        session.turn_task, session.request_id = task, request_id
        try:
            yield request_id
        finally:
            if session.turn_task is task:
                session.turn_task, session.request_id = None, None
            if self._sessions.get(session.session_id) is session:
                self._sessions[session.session_id] = session  # activity refreshes the TTL

    def build_prompt(self, session: ChatSession, user_text: str) -> TrimmedPrompt:
        """System prompt (with the document) + the newest history that fits + the new message.

        Older messages are left out (whole user/assistant pairs) until the
        prompt plus the answer budget fits the context window. A document that
        does not fit whole is replaced by its chunks most relevant to the question.
        """
        answer_tokens = min(session.sampling.max_new_tokens, self.engine.max_model_len // 2)
        budget = self.engine.max_model_len - answer_tokens
        new = {"role": "user", "content": user_text}
        system = self._system_message(session, user_text, budget - self._cost(new))
        history = list(session.history)
        costs = [self._cost(message) for message in history]
        room = budget - self._cost(system) - self._cost(new)
        kept = len(history)
        while kept and sum(costs[len(history) - kept :]) > room:
            kept -= 2 if kept >= 2 else 1
        while True:  # the estimate is per message; confirm with the real template
            messages = [system, *history[len(history) - kept :], new]
            prompt_tokens = len(self.engine.encode_chat(messages))
            if prompt_tokens <= budget or not kept:
                break
            kept -= 2 if kept >= 2 else 1
        if prompt_tokens > budget:
            # Not even the new message fits with a full answer: let the shared
            # budget rule decide whether any answer is possible at all.
            room_left = token_budget(
                self.engine.max_model_len, prompt_tokens, session.sampling.max_new_tokens
            )
            if room_left < min(16, session.sampling.max_new_tokens):
                raise TokenBudgetError(
                    f"Input length ({prompt_tokens} tokens) leaves no room for an answer in the "
                    f"model's context length ({self.engine.max_model_len} tokens)."
                )
        return TrimmedPrompt(messages, len(history) - kept)

    def _cost(self, message: Message) -> int:
        return self.engine.count_tokens(message["content"]) + MESSAGE_OVERHEAD_TOKENS

    def _system_message(self, session: ChatSession, question: str, room: int) -> Message:
        """The system prompt, carrying the document whole when it fits, else its relevant excerpts."""
        document = session.document
        if document is None:
            return {"role": "system", "content": session.system_prompt}
        whole = document_system_message(session.system_prompt, document.name, document.text)
        if self._cost(whole) <= room:
            return whole
        size = max(64, room // (2 * self.settings.retrieval_top_k))
        if document.chunk_tokens != size:
            document.chunks = tuple(split_into_chunks(document.text, self.engine.count_tokens, size))
            document.chunk_tokens = size
        picked = rank_chunks(list(document.chunks), question, self.settings.retrieval_top_k)
        excerpts = "\n\n".join(f"[excerpt {i + 1}] {document.chunks[i]}" for i in picked)
        return {
            "role": "system",
            "content": f"{session.system_prompt}\n\nThe user shared the document «{document.name}», too "
            f"long to show whole. The excerpts most relevant to the question:\n\n{excerpts}",
        }

    # --- documents -----------------------------------------------------------
    async def attach_files(self, session: ChatSession, files: list[tuple[str, str]]) -> AttachResult:
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
                readable.append(await asyncio.to_thread(self._read_file, path, name))
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
        text, tokens, cut_note = await asyncio.to_thread(self._bounded_by_tokens, text)
        if cut_note:
            notes.append(cut_note)
        if session.document is not None:
            notes.append(f"«{session.document.name}» is put aside: questions now go to «{name}».")
        session.document = SessionDocument(name=name, text=text, tokens=tokens)
        return AttachResult(session.document, tuple(errors), tuple(notes))

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
            data, name, max_pages=s.max_document_pages,
            max_docx_uncompressed_bytes=s.max_docx_uncompressed_bytes, max_chars=s.max_document_chars,
        )  # fmt: skip

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

    async def summarize(
        self, session: ChatSession, request: str, request_id: str, progress: Progress | None = None
    ) -> AsyncIterator[str]:
        """Stream a summary of the session's document; the exchange joins the history."""
        document = session.document
        assert document is not None, "summarize needs an attached document"
        parts: list[str] = []
        try:
            stream = self.summarizer.summarize(
                system_prompt=session.system_prompt, name=document.name, text=document.text,
                request=request, sampling=session.sampling, request_id=request_id, progress=progress,
            )  # fmt: skip
            async with contextlib.aclosing(stream):
                async for delta in stream:
                    parts.append(delta)
                    yield delta
        finally:
            session.history.append({"role": "user", "content": request or f"Summarize «{document.name}»."})
            if parts:
                session.history.append({"role": "assistant", "content": "".join(parts)})

    async def reply(self, session: ChatSession, prompt: TrimmedPrompt, request_id: str) -> AsyncIterator[str]:
        """Stream the answer to `prompt` and record the exchange in the history."""
        user_text = prompt.messages[-1]["content"]
        parts: list[str] = []
        try:
            stream = self.engine.generate(prompt.messages, session.sampling, request_id)
            async with contextlib.aclosing(stream):
                async for delta in stream:
                    parts.append(delta)
                    yield delta
        finally:
            session.history.append({"role": "user", "content": user_text})
            if parts:
                session.history.append({"role": "assistant", "content": "".join(parts)})
