"""Why a request was not admitted, in words a person can act on, and when to try again."""

from __future__ import annotations

import math

# Reasons, as counted in /metrics (chat_admission_refusals_total{reason=...}).
QUEUE_FULL = "queue_full"
WAIT_TOO_LONG = "wait_too_long"
ENGINE_QUEUE_FULL = "engine_queue_full"
USER_CONCURRENT_TURNS = "user_concurrent_turns"
USER_TOKENS_PER_MINUTE = "user_tokens_per_minute"
USER_DOCUMENTS_PER_HOUR = "user_documents_per_hour"
USER_MESSAGES_PER_MINUTE = "user_messages_per_minute"
SESSIONS_FULL = "sessions_full"
RESENT_EARLY = "resent_early"  # a chat message sent before the time a capacity refusal gave
QUOTA_DAY = "quota_day"  # the person's token budget for the UTC day is used up (services/usage)
QUOTA_MONTH = "quota_month"  # and for the UTC month
REASONS = (
    QUEUE_FULL,
    WAIT_TOO_LONG,
    ENGINE_QUEUE_FULL,
    USER_CONCURRENT_TURNS,
    USER_TOKENS_PER_MINUTE,
    USER_DOCUMENTS_PER_HOUR,
    USER_MESSAGES_PER_MINUTE,
    SESSIONS_FULL,
    RESENT_EARLY,
    QUOTA_DAY,
    QUOTA_MONTH,
)
CAPACITY = (QUEUE_FULL, WAIT_TOO_LONG, ENGINE_QUEUE_FULL)  # the service is full, not the person's share
TOKEN_LIMITS = (USER_TOKENS_PER_MINUTE, QUOTA_DAY, QUOTA_MONTH)  # what a request's tokens may not pass


class Refused(RuntimeError):
    """A request or turn the service will not take now; `str()` is the message the user sees."""

    def __init__(self, reason: str, message: str, retry_after_seconds: float | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.retry_after_seconds = retry_after_seconds


def rounded_seconds(seconds: float) -> str:
    """A duration as people say it: '8 s', '40 s', '3 min', '1 h 5 min'."""
    seconds = max(1.0, seconds)
    if seconds < 60:
        step = 1 if seconds < 10 else 5
        return f"{math.ceil(seconds / step) * step} s"
    minutes = math.ceil(seconds / 60)
    if minutes <= 60:
        return f"{minutes} min"
    hours, rest = divmod(minutes, 60)
    return f"{hours} h {rest} min" if rest else f"{hours} h"


def busy(reason: str, ahead: int, wait_seconds: float) -> Refused:
    """The refusal of a full service: what it is full of (the requests waiting ahead, else those
    running) and when a retry has a chance."""
    if ahead == 0:  # the line is empty (or all behind): what holds it up is what already runs
        why = "every place is taken by requests already running"
    else:
        why = f"{ahead} request{' is' if ahead == 1 else 's are'} waiting ahead of yours"
    message = f"The service is busy: {why}. Please try again in ~{rounded_seconds(wait_seconds)}."
    return Refused(reason, message, wait_seconds)
