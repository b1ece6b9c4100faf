"""The database replicas count per-person limits and sign-in attempts in (SHARED_LIMITS) and share
their waiting lines through (SHARED_LINE_SECONDS): the history's own, behind its breaker, so a
database that is down is skipped at once (services/admission/shared_database.py) and each process
counts its own meanwhile."""

from __future__ import annotations

import contextlib

from services.admission.shared_database import SharedDatabase
from services.admission.shared_limits import SharedLimits
from services.admission.shared_line import SharedLine
from services.admission.waiting_line import WaitingLine
from services.config import Settings
from services.history.service import History


def shared_database(settings: Settings, history: History | None, name: str) -> SharedDatabase | None:
    """The shared counts' database; None when limits are not shared (SQLite, SHARED_LIMITS=off, or no
    database at all): each process counts its own."""
    if history is None or history.engine is None or not settings.limits_shared:
        return None

    def available() -> bool:
        return history.migrated and history.health.available

    timeout = settings.database_timeout_seconds
    return SharedDatabase(history.engine, timeout, available, history.health.failed, name)


def shared_limits(
    settings: Settings, history: History | None, stack: contextlib.AsyncExitStack
) -> SharedLimits | None:
    """Admission's shared limits, started, with their stop (which frees this replica's turn leases)
    pushed on `stack`; None when limits are not shared."""
    database = shared_database(settings, history, "shared limits")
    if database is None:
        return None
    limits = SharedLimits(settings, database)
    limits.start()
    stack.push_async_callback(limits.stop)
    return limits


def shared_line(
    settings: Settings, history: History | None, line: WaitingLine, stack: contextlib.AsyncExitStack
) -> SharedLine | None:
    """`line` shared with the other replicas' (started, its stop pushed on `stack`); None when limits
    are not shared or SHARED_LINE_SECONDS is 0."""
    if settings.shared_line_seconds <= 0:
        return None
    database = shared_database(settings, history, "shared waiting line")
    if database is None:
        return None
    shared = SharedLine(settings, line, database)
    shared.start()
    stack.push_async_callback(shared.stop)
    return shared
