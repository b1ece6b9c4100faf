"""The overload rules of chat, applied to API requests: per-user limits, the shared queue, priority.

`ApiGate` calls `admit` for every generating request. The request counts as one turn of its key's
owner (USER_MAX_CONCURRENT_TURNS and USER_TOKENS_PER_MINUTE are shared with their chat), waits in
the same queue as chat turns, ranked as if it had arrived API_AGING_SECONDS later (so interactive
chat goes first, and API traffic cannot starve), and runs with that place as vLLM's priority.
A refusal becomes 429 with Retry-After.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable

from services.accounts.keys import KeyHolder
from services.admission.limits import user_key
from services.admission.refusals import QUEUE_FULL, WAIT_TOO_LONG, Refused
from services.admission.service import Admission
from services.admission.waiting_line import CHAT
from services.api.errors import ApiError
from services.api.usage import AnswerMeter

DEFAULT_RETRY_AFTER_SECONDS = 5.0  # a refusal without an estimate (too many requests at once)


class ApiAdmission:
    """`services.api.gate.Admission` over the service's `Admission`."""

    def __init__(
        self, admission: Admission, aging_seconds: float, count_tokens: Callable[[str], int]
    ) -> None:
        self.admission = admission
        self.aging_seconds = aging_seconds
        self.count_tokens = count_tokens

    def charge(self, holder: KeyHolder, answer: AnswerMeter) -> None:
        tokens = answer.tokens(self.count_tokens)
        limits = self.admission.limits
        limits.record_tokens(limits.usage(user_key(holder.user)), tokens)

    @contextlib.asynccontextmanager
    async def admit(self, holder: KeyHolder, path: str) -> AsyncIterator[int | None]:
        gate = self.admission.gate
        try:
            async with self.admission.turn(user_key(holder.user)) as turn:
                ticket = gate.ticket(CHAT)
                ticket.reports_tokens = False  # vLLM's layer streams it: its prefill is not seen
                if gate.settings.priority_scheduling:
                    ticket.key += self.aging_seconds
                turn.waiting.add(ticket)
                try:
                    await gate.enter(ticket)
                finally:
                    turn.waiting.discard(ticket)
                try:
                    priority = gate.engine_priority(ticket)
                    yield priority or None
                finally:
                    gate.release(ticket)
        except Refused as refusal:
            if refusal.reason in (QUEUE_FULL, WAIT_TOO_LONG):  # the service is full, not this person
                self.admission.note_refusal(refusal)
            retry = refusal.retry_after_seconds or DEFAULT_RETRY_AFTER_SECONDS
            raise ApiError(429, str(refusal), refusal.reason, retry_after_seconds=retry) from None
