"""Waiting in a test for something to happen: poll for it instead of sleeping a guessed time.

A fixed sleep is a guess of how long the event takes, and on a machine with a core taken by
something else the guess is short now and then. A poll returns as soon as the event happened; its
bound only says when to give up, so it is far past what the event takes (a failure bound, not a
promise: a test that checks a promise of speed says so with a bound of its own).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

# Milliseconds on a quiet machine, up to a second or two with a core busy elsewhere.
WAIT_SECONDS = 30.0


async def until(
    condition: Callable[[], object], what: str, timeout_seconds: float = WAIT_SECONDS, interval: float = 0.005
) -> None:
    """Return once `condition()` is true; fail, naming `what`, if it is not after `timeout_seconds`."""
    deadline = time.monotonic() + timeout_seconds
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {timeout_seconds} s"
        await asyncio.sleep(interval)


def until_sync(
    condition: Callable[[], object], what: str, timeout_seconds: float = WAIT_SECONDS, interval: float = 0.01
) -> None:
    """`until` for code without an event loop: sleeps between the checks."""
    deadline = time.monotonic() + timeout_seconds
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {timeout_seconds} s"
        time.sleep(interval)
