"""A stream delta that replaces the answer so far, for streams that take back what they said."""

from __future__ import annotations


class Rewrite(str):
    """The whole answer so far, in place of what was streamed before it (a summary that cut a loop
    off its end and goes on without it)."""


def followed_by(answer: str, delta: str) -> str:
    """`answer` after `delta`: appended, or replaced by a `Rewrite`."""
    return str(delta) if isinstance(delta, Rewrite) else answer + delta
