"""Is the database usable right now? One breaker for every statement, and the words for its trouble.

While the database is down (locked past the busy timeout, full, unreachable) statements are
skipped at once instead of each waiting for a timeout: chat goes on unsaved. A probe tries a small
write every HISTORY_RETRY_SECONDS; when it succeeds, saving resumes. `outage` counts outages, so
each session can be told once per outage, and told again when saving resumes.
"""

from __future__ import annotations

import logging
import sqlite3
import time

from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError

logger = logging.getLogger(__name__)

REASONS = {
    "locked": "the database is locked by another program",
    "full": "the disk holding the database is full",
    "unreachable": "the database cannot be reached",
    "failing": "the database reports errors",
}


def is_outage(error: BaseException) -> bool:
    """True for trouble with the database itself (connection, lock, disk), not for a bad statement."""
    if isinstance(error, OperationalError | InterfaceError | PoolTimeoutError | OSError | TimeoutError):
        return True
    if isinstance(error, DBAPIError):
        return bool(error.connection_invalidated) or isinstance(error.orig, sqlite3.OperationalError)
    return False


def classify(error: BaseException) -> str:
    """One of REASONS' keys, from the error's text (drivers differ; the words are stable)."""
    words = str(error).lower()
    if "locked" in words or "busy" in words:
        return "locked"
    if "full" in words or "no space" in words or "disk i/o" in words:
        return "full"
    if isinstance(error, OSError | TimeoutError | PoolTimeoutError) or any(
        w in words for w in ("connect", "refused", "timeout", "closed", "terminat", "unable to open")
    ):
        return "unreachable"
    return "failing"


class HistoryHealth:
    """The breaker: available, or down since a time for a reason."""

    def __init__(self) -> None:
        self.available = True
        self.reason: str | None = None
        self.down_since: float | None = None
        self.outage = 0  # number of the current (or last) outage
        self.failures_total = 0
        self.skipped_total = 0

    def failed(self, error: BaseException, outage: bool | None = None) -> None:
        """Record a failed statement; an outage (or `outage=True`) opens the breaker."""
        self.failures_total += 1
        if not (is_outage(error) if outage is None else outage):
            return
        if self.available:
            self.available = False
            self.reason = classify(error)
            self.down_since = time.monotonic()
            self.outage += 1
            logger.warning("chat history unavailable (%s): %s", self.reason, _first_line(error))

    def recovered(self) -> None:
        if not self.available:
            seconds = time.monotonic() - (self.down_since or time.monotonic())
            logger.warning("chat history available again after %.1f s; saving resumes", seconds)
        self.available = True
        self.reason = None
        self.down_since = None

    @property
    def message(self) -> str:
        """What a user is told while the breaker is open."""
        why = REASONS.get(self.reason or "failing", REASONS["failing"])
        return (
            f"Chat history is unavailable right now ({why}): this conversation is not being saved. "
            "Chat works as usual; saving resumes by itself when the database is back."
        )


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0][:300]
