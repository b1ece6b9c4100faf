"""A chat page's events, start to end: open the session, admit the turn, prompt or document summary,
stream the answer to the page, abort on Stop; the exchange joins the history.

`ChatTurns` holds the order of a turn; what the page shows goes through a `Page` (Chainlit's, in
services/web/chat_page.py), and what is kept with the conversation through `KeptConversations`
(services/history), so this room imports neither.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from services.admission.feedback import WaitingFeedback
from services.admission.refusals import Refused
from services.admission.service import Admission
from services.chat import branch
from services.chat.kept import KeptConversations, NothingKept  # noqa: F401  (NothingKept: re-exported)
from services.chat.model_choice import MODEL_KEY, chat_for, choose, known_of, model_of_thread, refusal_of
from services.chat.page import Page, Reply
from services.chat.service import ChatService
from services.chat.session import ChatSession
from services.chat.store import SessionStore
from services.engine import SamplingSettings
from services.engine.errors import RepetitionError, report_failure
from services.engine.rewrite import Rewrite
from services.engine.route_hint import set_route_hint

Files = list[tuple[str, str]]  # uploads of one message: (path on disk, name)


@dataclass(frozen=True)
class Asked:
    """What a turn answers: a message's text, uploads and stored id. `cut` runs first, inside the turn
    (after the turn it replaces ended), and calls the turn off by returning False; such a turn does
    not come through the page framework's message handler, so its answer gets a run of its own
    (`Page.run`). `sampling` replaces the session's for this answer (services/chat/rewinds.py: edit
    and regenerate)."""

    text: str
    files: Files = field(default_factory=list)
    message_id: str | None = None
    cut: Callable[[], Awaitable[bool]] | None = None
    sampling: SamplingSettings | None = None


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
        self.chats: Mapping[str, ChatService] = chats if chats is not None else {"": chat}

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
        await self._offer_regenerate(page, session)
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

    async def answer(self, page: Page, text: str, files: Files, message_id: str | None = None) -> None:
        """Answer one message (with its uploads and its stored id), streaming into a new reply."""
        if session := await self.open(page):
            await self.run(page, session, Asked(text, files, message_id))

    async def run(self, page: Page, session: ChatSession, asked: Asked) -> None:
        """One turn of `session`: the answer to `asked`, streamed into a new reply."""
        # Messages over MAX_MESSAGE_CHARS, and over the sender's message rate, never get here:
        # services/web/socket_guard.py refuses them before Chainlit stores them.
        await self._tell_history_state(page, session)
        if chat_for(self.chats, session, None) is None:
            await page.error(refusal_of(self.chats, session))
            return
        try:
            if await self._run_turn(page, session, asked):
                await self._offer_regenerate(page, session)
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

    async def _run_turn(self, page: Page, session: ChatSession, asked: Asked) -> bool:
        """The turn, in its order; False when `asked.cut` called it off."""
        async with self.sessions.turn(session) as request_id:
            session.running_turn = (asked.message_id, None, asked.text)
            if asked.cut is not None and not await asked.cut():
                return False
            async with page.run(asked.message_id) if asked.cut else contextlib.nullcontext():
                reply = page.reply()
                session.running_turn = (asked.message_id, reply.id, asked.text)
                await self._answer(page, session, asked, reply, request_id)
        return True

    async def _answer(
        self, page: Page, session: ChatSession, asked: Asked, reply: Reply, request_id: str
    ) -> None:
        """Answer into `reply`, streaming; refusals and failures end up in the reply."""
        person = page.person()
        files = asked.files
        chat = chat_for(self.chats, session)
        set_route_hint(page.thread_id, person)  # a router keeps the conversation on one server
        if len(known_of(self.chats)) > 1:  # which model wrote it: seen on the page, kept with the chat
            reply.metadata = {**reply.metadata, MODEL_KEY: session.model}
        try:
            async with self.admission.turn(person, documents=len(files)) as turn:
                stream = await self._open_stream(page, session, asked, request_id, reply.id)
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

    async def _offer_regenerate(self, page: Page, session: ChatSession) -> None:
        last = branch.last_turn(session)
        await page.offer_regenerate(last.answer_id if last else None)

    async def _open_stream(
        self, page: Page, session: ChatSession, asked: Asked, request_id: str, reply_id: str
    ) -> AsyncIterator[str] | None:
        """The answer's stream: a summary when files came with the message (the message is the
        request about them), else a chat reply; None when no file was readable."""
        chat = chat_for(self.chats, session)
        ids = (asked.message_id, reply_id)
        if asked.files:
            if not await self._read_documents(page, session, asked.files, chat):
                return None
            return chat.summarize(session, asked.text, request_id, page.summary_progress(), ids)
        prompt = chat.build_prompt(session, asked.text)
        if prompt.dropped_messages:
            await page.notice(
                f"{prompt.dropped_messages} older message(s) were left out to fit "
                f"the model's {chat.engine.max_model_len:,}-token context."
            )
        return chat.reply(session, prompt, request_id, ids, asked.sampling)

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
                if isinstance(delta, Rewrite):  # the answer so far, in place of what was shown
                    reply.content = str(delta)
                    await reply.update()
                else:
                    await reply.stream_token(delta)
    finally:
        await asyncio.shield(feedback.stop())
