"""The summaries as they were before the summary rework: the "before" side of summary_quality.py.

Same engine, same code path, with what the rework changed put back: English
instructions whatever the document's language, no repetition penalties, no
loop guard, no minimum summary length, map parts of up to a sixth of a chunk
(341 tokens), planning without room for follow-ups (one pass whenever
document + summary fit), the summary recorded in the history as "Summarize
«name».", and follow-ups that keep the document whole only if a full answer
budget still fits (else excerpts).
"""

from __future__ import annotations

import dataclasses

from services.chat.service import ChatService, _recorded
from services.chat.session import ChatSession, SessionDocument
from services.config import Settings
from services.documents.prompts import SummaryPrompts, document_system_message
from services.documents.summarizer import Summarizer, SummaryJob
from services.engine import LoopGuardConfig, Message

LOOP_GUARD_OFF = LoopGuardConfig(min_tokens=0)


def legacy_settings(settings: Settings) -> Settings:
    return settings.replace(repetition_penalty=1.0, frequency_penalty=0.0, single_pass_max_tokens=10**9)


class LegacyPrompts(SummaryPrompts):
    """The instructions of the code before the rework (English only)."""

    def single_pass(self, system_prompt: str, name: str, text: str) -> list[Message]:
        return [document_system_message(system_prompt, name, text), self.instruction()]

    def instruction(self) -> Message:
        request = self.request.strip()
        if request:
            text = f"{request}\n\n(Answer about the document above, in the language of this request.)"
        else:
            text = "Summarize the document above: its purpose, main points, and conclusions, "
            text += "in a few paragraphs."
        return {"role": "user", "content": text}

    def map_part(self, system_prompt: str, chunk: str, index: int, total: int) -> list[Message]:
        request = self.request.strip()
        language = f"in the language of this request: «{request}»" if request else ""
        text = (
            f"This is part {index} of {total} of a longer document. Summarize this part: keep its key "
            f"facts, names and numbers, in one short paragraph {language}"
        ).strip()
        return [
            {"role": "system", "content": system_prompt},
            {"role": "user", "content": f"{chunk}\n\n---\n{text}"},
        ]

    def reduce(self, system_prompt: str, partials: list[str]) -> list[Message]:
        joined = "\n\n".join(f"Part {i + 1}: {summary.strip()}" for i, summary in enumerate(partials))
        text = (
            "Above are summaries of consecutive parts of one document. Combine them into one coherent "
            "summary of the whole document: purpose, main points, conclusions."
        )
        if self.request:
            text += f"\n\nThe user's request: «{self.request.strip()}»; answer in its language."
        return [
            {"role": "system", "content": system_prompt},
            {"role": "user", "content": f"{joined}\n\n---\n{text}"},
        ]


class LegacySummarizer(Summarizer):
    prose = False  # no paraphrase guard, no stop at a "---" rule
    min_summary_tokens = 0
    follow_up_turns = 0

    @property  # type: ignore[override]
    def map_tokens(self) -> int:
        s = self.settings
        return max(32, min(s.summary_max_tokens, s.summary_chunk_tokens // 6))

    def prompts(self, job: SummaryJob) -> SummaryPrompts:
        return LegacyPrompts("en", job.request)


class LegacyChatService(ChatService):
    """ChatService as it behaved before: no plan kept for follow-ups, the summary recorded as asked."""

    def __init__(self, engine, settings: Settings) -> None:
        super().__init__(engine, legacy_settings(settings))
        self.summarizer = LegacySummarizer(engine, self.settings)

    def _plan(self, session: ChatSession, document: SessionDocument) -> None:
        document.language = None
        document.plan = None  # follow-ups: whole only when a full answer budget fits (the old rule)

    def summarize(self, session, request, request_id, progress=None):
        document = session.document
        assert document is not None
        plan = document.plan or self.summarizer.plan(self._job(session, request), document.tokens)
        job = dataclasses.replace(self._job(session, request), plan=plan)
        stream = self.summarizer.summarize(job, session.sampling, request_id, progress)
        return _recorded(session, request or f"Summarize «{document.name}».", stream)
