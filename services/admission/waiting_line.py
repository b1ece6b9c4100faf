"""Our waiting line in front of the engine: admit while the running limit allows, chat first, bounded.

Requests beyond the running limit (capacity.py, capped by pace.py) wait here, not inside vLLM, so they can
be counted, shown to their user with a place and an estimate (corrected by how late recent turns ran:
promises.py), and refused at once when the queue is full or the wait too long. The limit is the engine's:
others' requests at it (other app replicas on the same vLLM servers) hold slots too, and so do the chat
turns waiting ahead in their lines (`others`: other_replicas.py): across replicas the line is first come,
first served, and their document parts count against the documents' bounds below. ADMISSION_QUEUE_MAX
bounds the chat turns waiting (others' too); document parts wait besides them (each summary has at most
SUMMARY_CONCURRENCY parts in flight, and each person a few turns). Three kinds of work: chat turns,
document parts, API requests (which hold a chat slot; vLLM's layer streams them, so their tokens are not
seen here). Order: chat turns by arrival; document parts as if they had arrived DOCUMENT_AGING_SECONDS
later, API requests API_AGING_SECONDS later, so chat goes first but cannot starve them; the same order
goes to vLLM as priority (lower is earlier). Document parts hold at most DOCUMENT_SLOT_SHARE of the limit:
one that may not run yet keeps its place while chat turns behind it go. At most MAX_PREFILLING_REQUESTS
admitted requests may still be reading their prompt, documents one of them: the prefill each engine step
waits for stays small.
"""

from __future__ import annotations

import bisect
import contextlib
import heapq
import itertools
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable

from services.admission.capacity import DecodeCapacity
from services.admission.other_replicas import OtherReplicas
from services.admission.pace import StreamPace
from services.admission.promises import WaitPromises
from services.admission.refusals import QUEUE_FULL, WAIT_TOO_LONG, Refused, busy
from services.admission.tickets import API, CHAT, DOCUMENT, Ticket, first_service_seconds, queue_key
from services.config import Settings

OVERLOADED_SECONDS = 60.0  # a capacity refusal keeps the line overloaded this long
SERVICE_SMOOTHING = 0.1  # weight of each new measurement in the moving average
MAX_PREFILLING_REQUESTS = 2  # admitted requests still reading their prompt at most (may_prefill says why)
MEASURED_AFTER = 3  # chat turns released before the estimate alone decides (until then: one round)


class WaitingLine:
    """The running requests and our bounded line of waiting ones; `place` is the one way in."""

    def __init__(
        self,
        settings: Settings,
        capacity: DecodeCapacity,
        clock: Callable[[], float] = time.monotonic,
        max_prefilling: int = MAX_PREFILLING_REQUESTS,
    ):
        self.settings, self.max_prefilling = settings, max_prefilling  # max_prefilling 0: no bound
        self.capacity = capacity
        self.clock = clock
        self.pace = StreamPace(settings.reading_pace_tokens_per_second, clock)  # what chat streams get
        self.waiting: list[Ticket] = []  # sorted by Ticket.order
        self.waiting_by_kind: Counter[str] = Counter()  # chat turns: at most ADMISSION_QUEUE_MAX
        self.running: Counter[str] = Counter()
        self.foreign = 0  # others' requests at the same engine (other replicas): they hold slots too
        self.others = OtherReplicas()  # what other replicas at the engine share (shared_line.py)
        self._running_tickets: set[Ticket] = set()
        self.prefilling: set[Ticket] = set()  # admitted, no token yet (a subset of the running ones)
        self.refusals: Counter[str] = Counter()  # by reason (refusals.REASONS)
        self.refused_at: float | None = None  # the latest refusal for capacity
        self.admitted_total = 0
        self.waited_seconds_total = 0.0
        self.service_seconds = first_service_seconds(settings)
        self.promises = WaitPromises(clock)  # chat turns' promised and actual waits
        self.completed: Counter[str] = Counter()  # requests released, by kind
        self.epoch = clock()  # keys count from here
        self._numbers = itertools.count()

    @property
    def enabled(self) -> bool:
        return self.settings.reading_pace_tokens_per_second > 0

    @property
    def limit(self) -> int:
        """Requests allowed to run at once at the engine, ours and others' (no limit when admission is
        off): the capacity model's, with the stream pace's cap on the app's (the replicas that share)."""
        outside = max(0, self.foreign - self.others.running)  # clients that share no pace
        return self.pace.limit(self.capacity.limit, outside) if self.enabled else sys.maxsize

    @property
    def document_slots(self) -> int:
        """Document parts allowed to run at once: a share of the limit, at least one."""
        limit = self.limit
        return limit if limit == sys.maxsize else max(1, int(limit * self.settings.document_slot_share))

    def may_run(self, ticket: Ticket, documents_before: int = 0) -> bool:
        """Whether `ticket`'s kind has a slot (after `documents_before` parts admitted ahead of it;
        other replicas' parts hold the documents' slots too)."""
        documents = self.running[DOCUMENT] + self.others.documents + documents_before
        return ticket.kind != DOCUMENT or documents < self.document_slots

    def may_prefill(self, ticket: Ticket) -> bool:
        """Whether `ticket`'s prompt may be read now: few at once, as each engine step that reads one pauses
        every running stream, and documents one of them (at the engine: other replicas' too)."""
        if not self.enabled or self.max_prefilling <= 0:
            return True
        if ticket.kind == DOCUMENT and self.reading_document:
            return False
        return len(self.prefilling) < self.max_prefilling

    @property
    def reading_document(self) -> bool:
        """A document part (ours or another replica's) still reads its prompt at the engine."""
        return bool(self.others.documents_prefilling) or any(t.kind == DOCUMENT for t in self.prefilling)

    def has_room(self, ticket: Ticket) -> bool:
        """Under the running limit (others' turns waiting ahead hold their slots), or a chat turn while
        document parts run at the engine (any replica's) and no chat does: with DOCUMENT_SLOT_SHARE below
        1, parts never hold every slot against conversation (at a limit of 1, one held chat minutes)."""
        if self.engine_running + self.others_ahead(ticket.key) < self.limit:
            return self.others.allow(self.own_running)
        others = self.others
        documents, chats = self.running[DOCUMENT] + others.documents, self.running[CHAT] + others.chats
        return self.settings.document_slot_share < 1 and documents > 0 and ticket.kind == CHAT and not chats

    def _may_start(self, ticket: Ticket) -> bool:
        return self.has_room(ticket) and self.may_run(ticket) and self.may_prefill(ticket)

    @property
    def own_running(self) -> int:
        """This process's requests running at the engine (what its stream pace cap bounds)."""
        return sum(self.running.values())

    @property
    def engine_running(self) -> int:
        """Requests the engine holds against the limit: ours and others' (the limit is the engine's)."""
        return self.own_running + self.foreign

    @property
    def overloaded(self) -> bool:
        """Someone waits (here or in another replica's line), or a capacity refusal came recently."""
        recent = self.refused_at is not None and self.clock() - self.refused_at < OVERLOADED_SECONDS
        return bool(self.waiting or self.others.waiting) or recent

    @contextlib.asynccontextmanager
    async def place(self, work: str, owner: object = None) -> AsyncIterator[Ticket]:
        """Wait for a slot for a request of `work` (CHAT, DOCUMENT or API), hold it while the body runs,
        give it back on every exit (cancellation too). Raise Refused at once when the line is full or
        the wait too long. `owner` (its turn) is what `place_of` is asked about."""
        ticket = self._ticket(work, owner)
        await self._enter(ticket)
        try:
            yield ticket
        finally:
            self._release(ticket)

    def _ticket(self, work: str, owner: object = None) -> Ticket:
        now = self.clock()
        key = queue_key(self.settings, work, now - self.epoch)
        kind = DOCUMENT if work == DOCUMENT else CHAT  # an API request holds a chat slot
        return Ticket(kind, key, next(self._numbers), now, owner, reports_tokens=work != API)

    def refusal_now(self) -> Refused | None:
        """The refusal a chat request arriving now would get (counted), None when it would run or wait:
        a chat turn asks before any database work, so telling it the service is full costs nothing."""
        ticket = self._ticket(CHAT)
        ahead = bisect.bisect_left(self.waiting, ticket.order(), key=Ticket.order)
        if self._may_start(ticket) and self._nobody_ahead_runs(ticket, ahead):
            return None
        return self._chat_refusal(ticket, ahead)

    def _chat_refusal(self, ticket: Ticket, ahead: int) -> Refused | None:
        """The refusal of a chat `ticket` that must wait behind `ahead` of ours (counted); None when it
        may wait, with its promised wait set."""
        ahead_everywhere = ahead + self.others_ahead(ticket.key)
        if self.waiting_by_kind[CHAT] + len(self.others.waiting) >= self.settings.admission_queue_max:
            return self.refuse(QUEUE_FULL, ahead_everywhere, self.estimate_seconds(len(self.waiting)))
        estimate = self.estimate_seconds(ahead, ticket.key)
        # Until chat turns were measured the estimate is a guess from the answer budget: up to one
        # round of the running limit may still wait (the overload run's first burst queued 45 turns
        # behind a limit of 1 and waited minutes).
        measured = self.completed[CHAT] >= MEASURED_AFTER
        if estimate > self.settings.admission_max_wait_seconds and (
            measured or ahead_everywhere >= self.limit
        ):
            return self.refuse(WAIT_TOO_LONG, ahead_everywhere, estimate)
        ticket.promised = estimate
        return None

    async def _enter(self, ticket: Ticket) -> None:
        """Return once `ticket` may run; raise Refused at once when the line is full or the wait too long."""
        ahead = bisect.bisect_left(self.waiting, ticket.order(), key=Ticket.order)
        if self._may_start(ticket) and self._nobody_ahead_runs(ticket, ahead):
            self._admit(ticket)
            return
        if ticket.kind == CHAT and (refusal := self._chat_refusal(ticket, ahead)) is not None:
            raise refusal
        self.waiting.insert(ahead, ticket)
        self.waiting_by_kind[ticket.kind] += 1
        self.admit_waiting()  # those ahead may be parts over the documents' share
        try:
            await ticket.admitted.wait()
        except BaseException:
            if ticket.admitted.is_set():
                self._release(ticket)  # admitted while being cancelled: give the slot back
            else:
                self.waiting.remove(ticket)
                self.waiting_by_kind[ticket.kind] -= 1
            raise

    def _nobody_ahead_runs(self, ticket: Ticket, ahead: int) -> bool:
        """Nothing waits ahead, or only document parts that cannot run (over their share) ahead of a
        chat turn: they keep their place, and the turn goes."""
        return ahead == 0 or (ticket.kind == CHAT and all(t.kind == DOCUMENT for t in self.waiting[:ahead]))

    def refuse(self, reason: str, ahead: int, wait_seconds: float) -> Refused:
        """A refusal for capacity (the line's, or the engine's queue): counted; the line is overloaded."""
        self.refusals[reason] += 1
        self.refused_at = self.clock()
        return busy(reason, ahead, wait_seconds)

    def note_token(self, ticket: Ticket) -> None:
        """A running request streamed a token: chat streams feed the pace (what a person reads), and
        the first token ends its prefill (the next prompt may be read)."""
        if ticket.kind == CHAT:
            self.pace.token(ticket)
        if ticket in self.prefilling:
            self.prefilling.discard(ticket)
            if ticket.kind == CHAT:  # its first token: was the promise kept?
                self.promises.keep(ticket.promised, self.clock() - ticket.entered_at)
            self.admit_waiting()

    def _release(self, ticket: Ticket) -> None:
        """The ticket's request ended: free its slot and admit whoever is next."""
        self.pace.ended(ticket)
        if ticket.released or ticket.admitted_at is None:
            return
        ticket.released = True
        self.running[ticket.kind] -= 1
        self._running_tickets.discard(ticket)
        self.prefilling.discard(ticket)
        self.completed[ticket.kind] += 1
        served = self.clock() - ticket.admitted_at
        mean = self.service_seconds[ticket.kind]
        self.service_seconds[ticket.kind] = mean + SERVICE_SMOOTHING * (served - mean)
        self.admit_waiting()

    def admit_waiting(self) -> None:
        """Admit waiting tickets, first in order, while the limit allows (also after the limit grew)."""
        index = 0
        while index < len(self.waiting):
            ticket = self.waiting[index]
            if self._may_start(ticket):
                del self.waiting[index]
                self.waiting_by_kind[ticket.kind] -= 1
                self._admit(ticket)
            elif self.engine_running >= self.limit and self.running[CHAT] > 0:
                return  # full, and chat has its turn running: nobody else fits
            else:
                index += 1  # keeps its place; whoever may run goes

    def _admit(self, ticket: Ticket) -> None:
        ticket.admitted_at = self.clock()
        self.running[ticket.kind] += 1
        self._running_tickets.add(ticket)
        if ticket.reports_tokens:
            self.prefilling.add(ticket)
        self.admitted_total += 1
        self.waited_seconds_total += ticket.admitted_at - ticket.entered_at
        ticket.admitted.set()

    def others_ahead(self, key: float | None = None) -> int:
        """Chat turns waiting in other replicas' lines before `key` (None: all of them)."""
        return len(self.others.waiting) if key is None else bisect.bisect_left(self.others.waiting, key)

    def place_of(self, owner: object) -> tuple[int, float] | None:
        """The requests waiting ahead of the first waiting request of `owner` (others' lines too) and
        its expected wait; None when none of its requests wait."""
        index = next((i for i, ticket in enumerate(self.waiting) if ticket.owner is owner), None)
        if index is None:
            return None
        key = self.waiting[index].key
        return index + self.others_ahead(key), self.estimate_seconds(index, key)

    def estimate_seconds(self, ahead: int, key: float | None = None) -> float:
        """Expected wait behind `ahead` of our waiting requests and the chat turns other replicas' lines hold
        before `key` (None: all, as for a newcomer): a replay of the slots, each running request freeing its
        slot after its kind's measured service time less what it ran (others' after half a chat turn), each
        request ahead taking the earliest one; plus how late recent turns ran (promises.py)."""
        now = self.clock()
        service = self.service_seconds
        ours = [
            max(0.1 * service[t.kind], service[t.kind] - (now - (t.admitted_at or now)))
            for t in self._running_tickets
        ]
        free_at = sorted(ours + [0.5 * service[CHAT]] * self.foreign)
        free_at = free_at[: max(1, min(self.limit, len(free_at)))] or [0.0]
        heapq.heapify(free_at)
        for _ in range(self.others_ahead(key)):
            heapq.heappush(free_at, heapq.heappop(free_at) + service[CHAT])
        documents = 0
        for ticket in self.waiting[:ahead]:
            if not self.may_run(ticket, documents):
                continue  # over the documents' share: it waits for a part, not for a slot
            documents += ticket.kind == DOCUMENT
            heapq.heappush(free_at, heapq.heappop(free_at) + self.service_seconds[ticket.kind])
        return free_at[0] + self.promises.late_seconds
