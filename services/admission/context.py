"""The turn a request belongs to, carried in a context variable.

The handler enters a turn once; every engine request made while it runs,
including the summarizer's parallel parts in tasks of their own (tasks copy
the context they were created in), finds it here without being passed it.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass

from services.admission.limits import UserUsage


@dataclass
class TurnContext:
    """One turn of one user, as admission sees it."""

    user_key: str
    usage: UserUsage | None
    started_at: float
    documents: int = 0  # new uploads it came with
    counted: bool = False  # told to the keeper of usage as a turn (Admission.turn)


_current: contextvars.ContextVar[TurnContext | None] = contextvars.ContextVar("admission_turn", default=None)


def current_turn() -> TurnContext | None:
    return _current.get()


@contextlib.contextmanager
def entered_turn(turn: TurnContext) -> Iterator[TurnContext]:
    """Make `turn` the current one for the code inside (and the tasks it creates)."""
    token = _current.set(turn)
    try:
        yield turn
    finally:
        _current.reset(token)
