"""What the engine gets for a chat turn: system prompt (with the document), history that fits, the message."""

from __future__ import annotations

from dataclasses import dataclass

from services.chat.session import ChatSession
from services.config import Settings
from services.documents.chunking import split_into_chunks
from services.documents.planning import FOLLOW_UP_TURN_TOKENS
from services.documents.prompts import document_system_message
from services.documents.ranking import rank_chunks
from services.engine import ChatEngine, Message, TokenBudgetError, token_budget

# Chat-template tokens around each message (role markers, separators), with a margin.
MESSAGE_OVERHEAD_TOKENS = 6
RETRIEVAL_TOP_K = 4  # excerpts quoted for a question when the document does not fit whole


@dataclass(frozen=True)
class TrimmedPrompt:
    """The messages sent to the engine and how many history messages were left out."""

    messages: list[Message]
    dropped_messages: int


class PromptBuilder:
    """Builds chat prompts that fit the context window with room for the answer."""

    def __init__(self, engine: ChatEngine, settings: Settings) -> None:
        self.engine = engine
        self.settings = settings

    def build(self, session: ChatSession, user_text: str) -> TrimmedPrompt:
        """System prompt (with the document) + the newest history that fits + the new message.

        Older messages are left out (whole user/assistant pairs) until the
        prompt plus the answer budget fits the context window. A document the
        plan reads whole stays whole (the cached prefix of every question): its
        history and, if need be, its answer budget give way. Other documents are
        replaced by their chunks most relevant to the question.
        """
        answer_tokens = min(session.sampling.max_new_tokens, self.engine.max_model_len // 2)
        new = {"role": "user", "content": user_text}
        system = self._system_message(session, user_text, answer_tokens, self._cost(new))
        room_for_answer = self.engine.max_model_len - self._cost(system) - self._cost(new)
        budget = self.engine.max_model_len - max(1, min(answer_tokens, room_for_answer))
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

    def _system_message(
        self, session: ChatSession, question: str, answer_tokens: int, new_cost: int
    ) -> Message:
        """The system prompt, carrying the document whole when the plan says so, else its relevant excerpts.

        A whole document needs room for the question and a short answer at least
        (FOLLOW_UP_TURN_TOKENS); without a plan, for the full answer budget.
        """
        document = session.document
        if document is None:
            return {"role": "system", "content": session.system_prompt}
        plan = document.plan
        least_answer = answer_tokens if plan is None else min(answer_tokens, FOLLOW_UP_TURN_TOKENS)
        whole = document_system_message(session.system_prompt, document.name, document.text)
        if (plan is None or plan.whole) and self._cost(
            whole
        ) + new_cost + least_answer <= self.engine.max_model_len:
            return whole
        room = self.engine.max_model_len - answer_tokens - new_cost
        size = max(64, room // (2 * RETRIEVAL_TOP_K))
        if document.chunk_tokens != size:
            document.chunks = tuple(split_into_chunks(document.text, self.engine.count_tokens, size))
            document.chunk_tokens = size
        picked = rank_chunks(list(document.chunks), question, RETRIEVAL_TOP_K)
        excerpts = "\n\n".join(f"[excerpt {i + 1}] {document.chunks[i]}" for i in picked)
        return {
            "role": "system",
            "content": f"{session.system_prompt}\n\nThe user shared the document «{document.name}», too "
            f"long to show whole. The excerpts most relevant to the question:\n\n{excerpts}",
        }
