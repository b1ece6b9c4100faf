"""A request's place in the waiting line (waiting_line.py): its kind, its order, and vLLM's priority."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from services.config import Settings

CHAT = "chat"  # a chat turn's request, and the slots chat turns and API requests hold
DOCUMENT = "document"  # a document part's request, and its slots
API = "api"  # an API request's


def first_service_seconds(settings: Settings) -> dict[str, float]:
    """What a request of each kind holds a slot for until measured: its answer budget at the pace."""
    pace = settings.reading_pace_tokens_per_second or 5.0
    return {CHAT: min(settings.max_new_tokens, 128) / pace, DOCUMENT: settings.summary_max_tokens / pace}


@dataclass(eq=False)
class Ticket:
    """One engine request's place: waiting in our line, then running until released."""

    kind: str  # the slot it holds: CHAT or DOCUMENT
    key: float  # order: seconds since the line started, plus aging (queue_key)
    seq: int
    entered_at: float
    owner: object  # the turn it belongs to, for place_of
    reports_tokens: bool  # note_token is called for its tokens (not for the API's requests)
    admitted: asyncio.Event = field(default_factory=asyncio.Event)
    admitted_at: float | None = None
    released: bool = False
    promised: float = 0.0  # the wait it was told when it took its place (a chat turn's)

    def order(self) -> tuple[float, int]:
        return self.key, self.seq


def queue_key(settings: Settings, work: str, arrived_after: float) -> float:
    """A request's place in the line: seconds since the start, with priority scheduling on a document
    part's pushed back by DOCUMENT_AGING_SECONDS and an API request's by API_AGING_SECONDS."""
    aging = {DOCUMENT: settings.document_aging_seconds, API: settings.api_aging_seconds}.get(work, 0.0)
    return arrived_after + aging if settings.priority_scheduling else arrived_after


def engine_priority(settings: Settings, key: float) -> int:
    """A queue key as vLLM's priority (whole seconds, lower first); 0 when priority is off."""
    return int(key) if settings.priority_scheduling else 0
