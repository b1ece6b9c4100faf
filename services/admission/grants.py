"""How many answer tokens an engine request may run with, so that per-person token limits hold per
token and not only when a request starts.

A request's worst case is its prompt plus every sequence it runs times its answer limit. It is held
against what is left in each of its person's windows (a `Room`): USER_TOKENS_PER_MINUTE counts answer
tokens, the day's and month's budgets (services/usage) prompt and answer tokens, and in each the
requests still running count in full (what they were granted is reserved until they end, then their
actual tokens are counted instead), so a person's requests running at once cannot each pass the same
remainder. A request whose worst case fits runs as asked; one that does not runs with fewer answer
tokens per sequence when at least MIN_CUT_ANSWER_TOKENS fit (all it asked for, when fewer), and is
refused otherwise with the tightest window's refusal, which says when to try again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from services.admission.refusals import Refused


@dataclass(frozen=True)
class Demand:
    """The most an engine request may use: its prompt, its sequences, each sequence's answer limit."""

    prompt_tokens: int  # as counted before it runs
    answer_tokens: int  # per sequence: its max_tokens, or what its context leaves
    sequences: int = 1  # n choices of each prompt

    def worst_case(self, answer_tokens: int | None = None) -> int:
        """Prompt plus every sequence at `answer_tokens` (default: the demand's own)."""
        per_sequence = self.answer_tokens if answer_tokens is None else answer_tokens
        return self.prompt_tokens + max(1, self.sequences) * per_sequence


@dataclass(frozen=True)
class Room:
    """What is left in one of a person's windows, reserved tokens counted as used."""

    tokens: int
    counts_prompt: bool  # budgets count prompt and answer; the per-minute limit answers only
    refusal: Callable[[int], Refused]  # the refusal of a request that needs this many tokens here


@dataclass
class Grant:
    """What a request was let run with, and what it holds in its person's windows until it ends."""

    demand: Demand | None = None  # None: no window limits it (it runs as asked)
    answer_tokens: int | None = None  # per sequence: the demand's own, or fewer
    answer_reserved: int = 0  # held in the per-minute window
    budget_reserved: int = 0  # held in the budgets

    @property
    def cut(self) -> int | None:
        """The answer tokens per sequence when fewer than asked for; None when it runs as asked."""
        if self.demand is None or self.answer_tokens is None:
            return None
        return self.answer_tokens if self.answer_tokens < self.demand.answer_tokens else None


def answer_limit(demand: Demand, rooms: Iterable[Room], shortest: int) -> int:
    """The answer tokens per sequence `demand` may run with: all it asks for, or fewer so that its
    worst case fits every room; raise the refusal of the first room that cannot hold its prompt and
    `shortest` tokens per sequence (its whole answer, when it asks for fewer)."""
    sequences = max(1, demand.sequences)
    asked = max(0, demand.answer_tokens)
    floor = min(shortest, asked)
    limit = asked
    for room in rooms:
        prompt = max(0, demand.prompt_tokens) if room.counts_prompt else 0
        needed = max(1, prompt + sequences * floor)
        if room.tokens < needed:
            raise room.refusal(needed)
        limit = min(limit, (room.tokens - prompt) // sequences)
    return limit
