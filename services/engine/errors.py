"""Why a turn failed, in one sentence for the user and one log line (with the request id) for operators."""

from __future__ import annotations

import logging
import re

logger = logging.getLogger(__name__)

_ADDRESS = re.compile(r"0x[0-9a-fA-F]+")
REPETITION_STOPPED = "The answer started repeating itself and was stopped."


class TokenBudgetError(ValueError):
    """A prompt does not leave room for an answer in the context window."""


class EngineUnavailableError(RuntimeError):
    """The engine process died or never started, or no vLLM server can be reached."""


class RepetitionError(RuntimeError):
    """An answer started repeating itself and was stopped (its engine request is aborted)."""

    def __init__(
        self, period_tokens: int, repeated_tokens: int, kept_text: str, reason: str | None = None
    ) -> None:
        exact = f"the answer repeated a {period_tokens}-token unit over {repeated_tokens} tokens"
        super().__init__(f"{reason or exact} and was stopped")
        self.period_tokens = period_tokens
        self.repeated_tokens = repeated_tokens
        self.kept_text = kept_text  # the answer up to the end of the unit's first copy


class EchoError(RepetitionError):
    """A summary kept re-using its own phrases (a loop in paraphrase) and was stopped."""

    def __init__(self, reason: str, kept_text: str) -> None:
        # no exact unit repeated: kept_text is the answer before the sentence where the echoes began
        super().__init__(0, 0, kept_text, reason)


class EngineBusyError(RuntimeError):
    """A vLLM server refused a request because its queue is full (HTTP 503)."""


# vLLM's own admission control (MAX_NUM_QUEUED_REQS / MAX_NUM_QUEUED_TOKENS) raises these in process.
ENGINE_QUEUE_ERRORS = ("QueueOverflowError", "MaxQueuedTokensError")


def is_engine_busy(error: BaseException) -> bool:
    """True when the engine refused a request because its own queue is full."""
    return isinstance(error, EngineBusyError) or type(error).__name__ in ENGINE_QUEUE_ERRORS


def describe_failure(error: BaseException) -> str:
    """The one short, user-facing sentence for any failure of a turn."""
    if isinstance(error, TokenBudgetError):
        return f"Your message is too long for this model. {error}"
    if isinstance(error, RepetitionError):
        return REPETITION_STOPPED
    if is_engine_busy(error):
        return "The service is busy right now. Please try again in a minute."
    if isinstance(error, EngineUnavailableError):
        return "The model is not available right now. Please try again in a moment."
    if type(error).__name__ == "EngineDeadError":
        return "The model stopped working. The operators have been alerted; please retry later."
    return "Something went wrong while generating the answer. Please try again."


def sanitize(text: str) -> str:
    """Strip memory addresses from an error text before it reaches a log or a user."""
    return _ADDRESS.sub("0x…", text)


def report_failure(error: BaseException, request_id: str | None) -> str:
    """Log a failed turn for the operator; return the sentence the user sees."""
    expected = isinstance(
        error, (TokenBudgetError, EngineUnavailableError, RepetitionError)
    ) or is_engine_busy(error)
    log = logger.warning if expected else logger.error
    log(
        "request %s failed: %s: %s",
        request_id,
        type(error).__name__,
        sanitize(str(error)),
        exc_info=None if expected else error,
    )
    return describe_failure(error)
