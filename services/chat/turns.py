"""A chat page's events, start to end: open the session, admit the turn, prompt or document summary,
stream the answer to the page, abort on Stop; the exchange joins the history.

`ChatTurns` holds the order of a turn; what the page shows goes through a `Page` (Chainlit's, in
services/web/chat_page.py), and what is kept with the conversation through `KeptConversations`
(services/history), so this room imports neither.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import Any, Protocol

from services.admission.feedback import Show, WaitingFeedback
from services.admission.refusals import Refused
from services.admission.service import Admission
from services.chat.model_choice import MODEL_KEY, chat_for, choose, model_of_thread, refusal_of
from services.chat.service import ChatService
from services.chat.session import ChatSession, SessionDocument
from services.chat.store import SessionStore
from services.documents.progress import Progress
from services.engine.errors import RepetitionError, report_failure

Files = list[tuple[str, str]]  # uploads of one message: (path on disk, name)


class Reply(Protocol):
    """The answer's message on the page, streamed into, sent at the end of the turn."""

    content: str
    metadata: dict[str, Any]

    async def stream_token(self, token: str) -> None: ...

    async def send(self) -> Any: ...

    async def update(self) -> Any: ...


class Step(Protocol):
    output: str


class Page(Protocol):
    """The chat page of one tab, as a turn sees it."""

    @property
    def session_id(self) -> str: ...

    @property
    def user_identifier(self) -> str | None: ...

    @property
    def thread_id(self) -> str: ...

    @property
    def chosen_model(self) -> str | None:
        """The model the page asks for (its chat profile); None: no choice made."""
        ...

    def person(self) -> str:
        """Whose share a turn counts against (admission's per-user limits)."""
        ...

    def reply(self) -> Reply:
        """A new, empty answer, marked as part of the model's history."""
        ...

    def status(self) -> Show:
        """Where a waiting turn's status is shown (its place in line)."""
        ...

    def summary_progress(self) -> Progress: ...

    def reading(self) -> contextlib.AbstractAsyncContextManager[Step]:
        """A step shown while uploads are read."""
        ...

    async def refused(self, refusal: Refused) -> None: ...

    async def error(self, text: str) -> None: ...

    async def notice(self, text: str) -> None: ...

    async def send_settings(self, session: ChatSession, max_new_tokens_limit: int) -> None: ...

    def keep_settings(self, values: dict[str, Any]) -> None:
        """What the page keeps as the conversation's chat settings."""
        ...

    def forget(self) -> None:
        """Drop the page framework's own copy of the session's messages."""
        ...


class KeptConversations(Protocol):
    """What is kept with a conversation (services/history)."""

    enabled: bool

    def notice_for(self, session: ChatSession) -> str | None: ...

    async def save_document(self, thread_id: str, document: SessionDocument) -> Any: ...

    async def restore(
        self, sessions: SessionStore, session: ChatSession, thread: Mapping[str, Any]
    ) -> None: ...


class NothingKept:
    """No conversation is kept (a service built without sign-in and history: tests, benchmarks)."""

    enabled = False

    def notice_for(self, session: ChatSession) -> str | None:
        return None

    async def save_document(self, thread_id: str, document: SessionDocument) -> None:
        pass

    async def restore(self, sessions: SessionStore, session: ChatSession, thread: Mapping[str, Any]) -> None:
        pass


class ChatTurns:
    """Every chat page event of the service, over its sessions, admission, chat and kept history."""

    def __init__(
        self,
        sessions: SessionStore,
        admission: Admission,
        chat: ChatService,
        history: KeptConversations,
        chats: Mapping[str, ChatService] | None = None,
    ) -> None:
        """`chats`: a chat service per served model, the default first (None: `chat` alone)."""
        self.sessions = sessions
        self.admission = admission
        self.chat = chat
        self.history = history
        self.chats: dict[str, ChatService] = dict(chats) if chats else {"": chat}

    async def open(self, page: Page) -> ChatSession | None:
        """This tab's session; None (and the user told why) when the service holds all it can."""
        try:
            return self.sessions.open(page.session_id, page.user_identifier)
        except Refused as refusal:
            await page.refused(refusal)
            return None

    async def start(self, page: Page, defaults: Mapping[str, Any] | None = None) -> None:
        """A new chat: the person's `defaults` applied, its settings panel, whether chats are saved."""
        if session := await self.open(page):
            if defaults:
                self.sessions.update_settings(session, defaults)
                page.keep_settings(self.sessions.chat_settings(session))
            if refusal := choose(self.chats, session, page.chosen_model):
                await page.error(refusal)
            await page.send_settings(session, self.sessions.settings.max_new_tokens_limit)
            await self._tell_history_state(page, session)

    async def resume(self, page: Page, thread: Mapping[str, Any]) -> None:
        """A stored conversation opened from the sidebar (or after a reload): the model gets its turns
        back."""
        session = await self.open(page)
        if session is None:
            return
        await self.history.restore(self.sessions, session, thread)
        # The model that answered it; a page the conversation's model was not kept for: its choice.
        if refusal := choose(self.chats, session, model_of_thread(thread) or page.chosen_model):
            await page.error(refusal)
        await page.send_settings(session, self.sessions.settings.max_new_tokens_limit)
        if session.document is not None:
            await page.notice(
                f"«{session.document.name}» is still attached: questions about it work as before."
            )
        await self._tell_history_state(page, session)

    async def update_settings(self, page: Page, values: dict) -> None:
        session = await self.open(page)
        if session is not None:
            self.sessions.update_settings(session, values)
        # The page stored the values as sent (any keys, any sizes) and keeps them with the conversation:
        # what it keeps is what is in effect.
        page.keep_settings(self.sessions.chat_settings(session) if session else {})

    async def answer(self, page: Page, text: str, files: Files) -> None:
        """Answer one message (with its uploads), streaming into a new reply."""
        session = await self.open(page)
        if session is None:
            return
        # Messages over MAX_MESSAGE_CHARS, and over the sender's message rate, never get here:
        # services/web/socket_guard.py refuses them before Chainlit stores them.
        await self._tell_history_state(page, session)
        if (chat := chat_for(self.chats, session, None)) is None:
            await page.error(refusal_of(self.chats, session))
            return
        try:
            await self._run_turn(page, session, text, files, page.reply(), chat)
        finally:
            # Also after a cancellation: a late reply.update() re-adds the session to
            # Chainlit's chat_contexts after on_chat_end has already cleared it.
            page.forget()

    def stop(self, session_id: str) -> None:
        """Stop pressed: cancel the running turn (aborting its engine request)."""
        self.sessions.stop(session_id)

    def end(self, session_id: str, cleared: bool, keep_seconds: float) -> list[str]:
        """The page went away: cancel its running turn now. The conversation stays `keep_seconds` so a
        reconnecting page continues where it was; "New chat" (`cleared`) ends it now. Returns the
        sessions dropped for the bound on those awaiting their page (SessionStore.disconnect)."""
        if cleared:
            self.sessions.close(session_id)
            return []
        return self.sessions.disconnect(session_id, keep_seconds)

    async def _run_turn(
        self, page: Page, session: ChatSession, text: str, files: Files, reply: Reply, chat: ChatService
    ) -> None:
        """Answer into `reply`, streaming; refusals and failures end up in the reply."""
        person = page.person()
        if len(self.chats) > 1:  # which model wrote it: seen on the page, kept with the conversation
            reply.metadata = {**reply.metadata, MODEL_KEY: session.model}
        async with self.sessions.turn(session) as request_id:
            try:
                async with self.admission.turn(person, documents=len(files)) as turn:
                    stream = await self._open_stream(page, session, text, files, request_id, chat)
                    if stream is not None:
                        await _stream_into(reply, stream, self.admission.feedback(turn, page.status()))
            except Refused as refusal:  # the service is full, or a per-user limit: say when to retry
                chat.attachments.discard(files)
                reply.content += ("\n\n" if reply.content else "") + f"⏳ {refusal}"
                reply.metadata = {"refused": refusal.reason}
            except asyncio.CancelledError:
                if reply.content:
                    await asyncio.shield(reply.update())
                raise
            except Exception as error:  # one error shape for every failure of a turn
                if isinstance(error, RepetitionError):  # show what the history keeps: no repetition
                    reply.content = error.kept_text
                if not reply.content:
                    reply.metadata = {}  # nothing the model said: not part of its history
                reply.content += ("\n\n" if reply.content else "") + f"⚠️ {report_failure(error, request_id)}"
            await reply.send()

    async def _open_stream(
        self, page: Page, session: ChatSession, text: str, files: Files, request_id: str, chat: ChatService
    ) -> AsyncIterator[str] | None:
        """The answer's stream: a summary when files came with the message (the message is the
        request about them), else a chat reply; None when no file was readable."""
        if files:
            if not await self._read_documents(page, session, files, chat):
                return None
            return chat.summarize(session, text, request_id, page.summary_progress())
        prompt = chat.build_prompt(session, text)
        if prompt.dropped_messages:
            await page.notice(
                f"{prompt.dropped_messages} older message(s) were left out to fit "
                f"the model's {chat.engine.max_model_len:,}-token context."
            )
        return chat.reply(session, prompt, request_id)

    async def _read_documents(
        self, page: Page, session: ChatSession, files: Files, chat: ChatService
    ) -> bool:
        """Attach uploads to the session, telling the user what happened; False if none was readable."""
        async with page.reading() as step:
            result = await chat.attach_files(session, files)
            if result.document is not None:
                step.output = f"«{result.document.name}»: {result.document.tokens:,} tokens."
        for error in result.errors:
            await page.error(error)
        if result.notes:
            await page.notice(" ".join(result.notes))
        if result.document is not None and self.history.enabled:  # kept with the conversation
            await self.history.save_document(page.thread_id, result.document)
        return result.document is not None

    async def _tell_history_state(self, page: Page, session: ChatSession) -> None:
        """Say once when conversations stop being saved, and once when saving resumes."""
        if text := self.history.notice_for(session):
            await page.notice(text)


async def _stream_into(reply: Reply, stream: AsyncIterator[str], feedback: WaitingFeedback) -> None:
    """Stream the answer into `reply`; until its first token the user sees their place in line."""
    feedback.start()
    try:
        # Closed here, not by the garbage collector: a Stop that lands while a
        # token is being sent must still end the engine request at once.
        async with contextlib.aclosing(stream):
            async for delta in stream:
                await feedback.stop()  # the answer takes the status message's place
                await reply.stream_token(delta)
    finally:
        await asyncio.shield(feedback.stop())
