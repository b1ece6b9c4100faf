"""What a chat turn does: prompt, answer or summary, attachments; every exchange joins the history."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from services.admission.errors import Refused
from services.chat.attachments import Attachments, AttachResult
from services.chat.prompt import PromptBuilder, TrimmedPrompt
from services.chat.session import ChatSession
from services.config import Settings
from services.documents.summarizer import Progress, Summarizer
from services.engine.chat_engine import ChatEngine


class ChatService:
    """The operations of a turn on a session, over one engine."""

    def __init__(
        self, engine: ChatEngine, settings: Settings, document_engine: ChatEngine | None = None
    ) -> None:
        """`engine` answers chat turns; `document_engine` (default: the same) runs document summaries,
        so that the two can be queued apart (services/admission)."""
        self.engine = engine
        self.settings = settings
        self.prompts = PromptBuilder(engine, settings)
        self.attachments = Attachments(engine, settings)
        self.summarizer = Summarizer(document_engine or engine, settings)

    def build_prompt(self, session: ChatSession, user_text: str) -> TrimmedPrompt:
        """The messages for answering `user_text` in this session (see PromptBuilder.build)."""
        return self.prompts.build(session, user_text)

    async def attach_files(self, session: ChatSession, files: list[tuple[str, str]]) -> AttachResult:
        """Read uploads (path, name) into the session's document (see Attachments.attach)."""
        return await self.attachments.attach(session, files)

    def reply(self, session: ChatSession, prompt: TrimmedPrompt, request_id: str) -> AsyncIterator[str]:
        """Stream the answer to `prompt`; the exchange joins the history."""
        stream = self.engine.generate(prompt.messages, session.sampling, request_id)
        return _recorded(session, prompt.messages[-1]["content"], stream)

    def summarize(
        self, session: ChatSession, request: str, request_id: str, progress: Progress | None = None
    ) -> AsyncIterator[str]:
        """Stream a summary of the session's document; the exchange joins the history."""
        document = session.document
        assert document is not None, "summarize needs an attached document"
        stream = self.summarizer.summarize(
            system_prompt=session.system_prompt, name=document.name, text=document.text,
            request=request, sampling=session.sampling, request_id=request_id, progress=progress,
        )  # fmt: skip
        return _recorded(session, request or f"Summarize «{document.name}».", stream)


async def _recorded(session: ChatSession, user_text: str, stream: AsyncIterator[str]) -> AsyncIterator[str]:
    """Pass `stream` through; afterwards (also when cut short) add the exchange to the history.

    A turn refused before it started (the service was full) leaves no trace: its user sends it again.
    """
    parts: list[str] = []
    refused = False
    try:
        async with contextlib.aclosing(stream):  # type: ignore[type-var]  (an async generator)
            async for delta in stream:
                parts.append(delta)
                yield delta
    except Refused:
        refused = not parts
        raise
    finally:
        if not refused:
            session.history.append({"role": "user", "content": user_text})
        if parts:
            session.history.append({"role": "assistant", "content": "".join(parts)})
