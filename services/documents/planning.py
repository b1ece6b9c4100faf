"""How a document is read, decided once from the numbers when it is attached, and told to the user.

Read whole: the document goes into the system message, its summary is one
pass, and every follow-up question starts with the same tokens, so vLLM's
prefix cache serves the document's KV again. That only holds while the
document, its summary and the follow-up turns all fit the context window, so
the plan reserves room for the summary and FOLLOW_UP_TURNS turns up front.
A document that does not fit with that room, or that is longer than
SINGLE_PASS_MAX_TOKENS (from there on map-reduce gives the first words of
the summary sooner), is summarized in parts (map-reduce), and questions
about it are answered from its most relevant passages (retrieval).
"""

from __future__ import annotations

from dataclasses import dataclass

WHOLE = "whole"
IN_PARTS = "map-reduce"
# Follow-up turns a document read whole must leave room for after its summary, so that it stays the
# cached prefix of every question; a longer document is summarized in parts instead.
FOLLOW_UP_TURNS = 3
FOLLOW_UP_TURN_TOKENS = 256  # reserved per follow-up turn: a question and a short answer


@dataclass(frozen=True)
class Budget:
    """The numbers a plan is made from, in tokens."""

    max_model_len: int
    summary_tokens: int
    follow_up_turns: int
    follow_up_turn_tokens: int
    single_pass_max_tokens: int

    @property
    def reserved_tokens(self) -> int:
        """Room kept free after the document: its summary and the follow-up turns."""
        return self.summary_tokens + self.follow_up_turns * self.follow_up_turn_tokens


@dataclass(frozen=True)
class DocumentPlan:
    """Whole (one pass, cached prefix) or in parts (map-reduce summary, retrieval for questions)."""

    path: str  # WHOLE or IN_PARTS
    document_tokens: int
    prompt_tokens: int  # the single-pass prompt: system message with the document, and the request
    budget: Budget

    @property
    def whole(self) -> bool:
        return self.path == WHOLE

    @property
    def fits(self) -> bool:
        return self.prompt_tokens + self.budget.reserved_tokens <= self.budget.max_model_len

    def note(self, name: str) -> str | None:
        """What to tell the user about a document that is not read whole; None when it is."""
        if self.whole:
            return None
        b = self.budget
        if not self.fits:
            why = (
                f"with room for its summary and {b.follow_up_turns} follow-up questions it does not fit "
                f"the model's {b.max_model_len:,}-token context"
            )
        else:
            why = f"from {b.single_pass_max_tokens:,} tokens on, a summary in parts starts writing sooner"
        return (
            f"«{name}» has {self.document_tokens:,} tokens: {why}. It is summarized in parts (map-reduce), "
            "and questions about it are answered from its most relevant passages (retrieval)."
        )


def plan_document(document_tokens: int, prompt_tokens: int, budget: Budget) -> DocumentPlan:
    """Read whole when the single-pass prompt plus the reserved room fits and the document is not too long."""
    plan = DocumentPlan(WHOLE, document_tokens, prompt_tokens, budget)
    if plan.fits and document_tokens <= budget.single_pass_max_tokens:
        return plan
    return DocumentPlan(IN_PARTS, document_tokens, prompt_tokens, budget)
