"""What a chat turn does: prompt, answer or summary, attachments; every exchange joins the history."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator

from services.admission.refusals import Refused
from services.chat import branch
from services.chat.attachments import Attachments, AttachResult
from services.chat.prompt import PromptBuilder, TrimmedPrompt
from services.chat.session import ChatSession, SessionDocument
from services.config import Settings
from services.documents.language import document_language
from services.documents.progress import Progress
from services.documents.summarizer import Summarizer, SummaryJob
from services.engine import ChatEngine, RepetitionError, SamplingSettings, followed_by

Ids = tuple[str | None, str | None]  # the stored ids of a turn's message and of its answer


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
        """Read uploads (path, name) into the session's document and plan how to read it.

        The user is told when the document will not be read whole (see planning.py).
        """
        result = await self.attachments.attach(session, files)
        document = result.document
        if document is None:
            return result
        await self.attachments.threads.run(self._plan, session, document)
        note = document.plan.note(document.name) if document.plan is not None else None
        return dataclasses.replace(result, notes=(*result.notes, note)) if note else result

    def _plan(self, session: ChatSession, document: SessionDocument) -> None:
        document.language = document_language(document.text)
        document.plan = self.summarizer.plan(self._job(session, ""), document.tokens)

    def _job(self, session: ChatSession, request: str) -> SummaryJob:
        document = session.document
        assert document is not None, "a summary needs an attached document"
        return SummaryJob(
            session.system_prompt, document.name, document.text, request, document.language, document.plan
        )

    def reply(
        self,
        session: ChatSession,
        prompt: TrimmedPrompt,
        request_id: str,
        ids: Ids = (None, None),
        sampling: SamplingSettings | None = None,
    ) -> AsyncIterator[str]:
        """Stream the answer to `prompt`; the exchange joins the history, with the ids of its stored
        message and answer (`ids`). `sampling` replaces the session's for this answer."""
        stream = self.engine.generate(prompt.messages, sampling or session.sampling, request_id)
        return _recorded(session, prompt.messages[-1]["content"], stream, ids)

    def summarize(
        self,
        session: ChatSession,
        request: str,
        request_id: str,
        progress: Progress | None = None,
        ids: Ids = (None, None),
    ) -> AsyncIterator[str]:
        """Stream a summary of the session's document; the exchange joins the history.

        A document read whole records the instruction the model saw, so the next
        question shares the summary's prompt (and its KV) up to the summary's end.
        """
        job = self._job(session, request)
        stream = self.summarizer.summarize(job, session.sampling, request_id, progress)
        whole = job.plan is not None and job.plan.whole
        asked = self.summarizer.prompts(job).instruction()["content"] if whole else None
        return _recorded(session, asked or request or f"Summarize «{job.name}».", stream, ids)


async def _recorded(
    session: ChatSession, user_text: str, stream: AsyncIterator[str], ids: Ids
) -> AsyncIterator[str]:
    """Pass `stream` through; afterwards (also when cut short) add the exchange to the history.

    An answer the loop guard stopped is recorded without its repetitions.
    A turn refused before it started (the service was full) leaves no trace: its user sends it again.
    """
    answer = ""
    refused = False
    try:
        async with contextlib.aclosing(stream):  # type: ignore[type-var]  (an async generator)
            async for delta in stream:
                answer = followed_by(answer, delta)
                yield delta
    except RepetitionError as error:
        answer = error.kept_text
        raise
    except Refused:
        refused = not answer
        raise
    finally:
        if not refused:
            branch.record(session, {"role": "user", "content": user_text}, ids[0])
        if answer:
            branch.record(session, {"role": "assistant", "content": answer}, ids[1])
