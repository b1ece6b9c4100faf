"""The one place where overload rules apply: turns open here (per-user limits), and every engine
request of chat, documents and the API goes through `Admission.admit` (queue, priority, capacity).

Chat and documents call `AdmittedEngine.generate`, which admits each request inside the turn the
handler opened; the API admits each request as a turn of its own. Per-person limits are checked
here only: in this process's tables (limits.py), then, with replicas on PostgreSQL, in the shared
ones (shared_limits.py), so a person gets each limit once across replicas. A turn's context (who asks)
travels in a context variable, so the summarizer's parallel part requests, which run in tasks of
their own, are accounted to the turn that started them without being passed anything. Each
request's worst case is held against what its person has left (grants.py): it runs as asked, with
shorter answers, or not at all, and holds what it was granted until it ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from services.admission.accounting import Accounting, NoAccounting
from services.admission.capacity import DecodeCapacity
from services.admission.context import TurnContext, current_turn, entered_turn
from services.admission.feedback import Show, WaitingFeedback
from services.admission.grants import Demand, Grant, answer_limit
from services.admission.limits import UserLimits
from services.admission.refusals import ENGINE_QUEUE_FULL, TOKEN_LIMITS, Refused
from services.admission.shared_limits import SharedLimits
from services.admission.shared_line import SharedLine
from services.admission.tickets import engine_priority
from services.admission.waiting_line import CHAT, DOCUMENT, WaitingLine
from services.config import Settings
from services.engine import ChatEngine, EngineLoad, Message, SamplingSettings, StreamStats, is_engine_busy
from services.engine.warmup import READING_PACE_HEADROOM

logger = logging.getLogger(__name__)

REFRESH_SECONDS = 1.0  # how often the running limit is re-derived from the engine's numbers
FOREIGN_MAX_AGE_SECONDS = 5.0  # others' requests at the engine, read longer ago than this, count as none


class Admission:
    """Owns the capacity model, the waiting line, the per-user limits, and the task that refreshes the
    limit; `admit` is the one way to the engine."""

    def __init__(
        self,
        settings: Settings,
        load: EngineLoad,
        max_running: int,
        accounting: Accounting | None = None,
        shared: SharedLimits | None = None,
    ) -> None:
        """`accounting`: who keeps usage and checks budgets (services/usage); None: nobody. `shared`: the
        per-person limits replicas share (shared_limits.py); None: this process's alone."""
        self.settings = settings
        self.shared = shared
        self.accounting: Accounting = accounting if accounting is not None else NoAccounting()
        self.load = load
        self.capacity = DecodeCapacity(
            settings.reading_pace_tokens_per_second * READING_PACE_HEADROOM, max_running
        )
        self.line = WaitingLine(settings, self.capacity)
        self.limits = UserLimits(settings)
        self.shared_line: SharedLine | None = None  # shared with other replicas' lines, once started
        self._task: asyncio.Task | None = None

    def learn_from_warm_up(
        self, seconds_per_token_by_batch: dict[int, float], busy_seconds: float = 5.0
    ) -> None:
        """Take the warm-up's decode measurements as the line live windows scale (its own windows are
        skipped)."""
        self.capacity.set_baseline(seconds_per_token_by_batch)
        for size, seconds_per_token in seconds_per_token_by_batch.items():
            if size <= self.capacity.max_running:
                self.capacity.observe_batch(size, seconds_per_token, busy_seconds)
        self.capacity.skip_until(time.monotonic())

    def start(self) -> None:
        self._task = asyncio.create_task(self._refresh_forever(), name="admission-refresh")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _refresh_forever(self) -> None:
        while True:
            await asyncio.sleep(REFRESH_SECONDS)
            try:
                self.refresh()
            except Exception:  # a bad measurement must not stop admissions
                logger.exception("admission refresh failed")

    def refresh(self, now: float | None = None) -> None:
        """Learn from the engine's latest windows (none that ended by `now`, monotonic, while a document
        part reads its prompt) and who else it serves, then admit whoever the new limit lets in."""
        now = time.monotonic() if now is None else now
        if self.line.reading_document:  # its prefill chunks stretch steps that count no prompt token yet
            self.capacity.skip_until(now)
        self.capacity.update(self.load)
        self.line.foreign = self.load.foreign_requests(now, FOREIGN_MAX_AGE_SECONDS)
        self.line.pace.adjust(self.line.own_running + self.line.others.running, self.capacity.limit)
        self.line.admit_waiting()

    @property
    def overloaded(self) -> bool:
        """Someone waits in our line, or a request was refused for capacity in the last minute."""
        return self.line.overloaded

    def status(self) -> dict[str, Any]:
        """What /status shows of admission: the limit, the queue, refusals, the learned decode speed."""
        line = self.line
        return {
            "enabled": line.enabled,
            "running": dict(line.running),
            "others_running": line.foreign,
            "running_limit": line.limit if line.enabled else None,
            "capacity_limit": self.capacity.limit,  # the decode model's; the stream pace may cap it lower
            "waiting": len(line.waiting),
            "admitted_total": line.admitted_total,
            "refusals_total": dict(line.refusals),
            "service_seconds": {kind: round(value, 2) for kind, value in line.service_seconds.items()},
            "seconds_per_token_by_batch": self.capacity.seconds_per_token(),
            "slowdown_vs_warm_up": round(self.capacity.slowdown, 2),
            "chat_wait_promised_vs_actual": line.promises.status(),
            "stream_pace": line.pace.status(),
            "users_tracked": len(self.limits),
            "shared_limits": self.shared.status() if self.shared is not None else None,
            "shared_line": self.shared_line.status() if self.shared_line is not None else None,
        }

    async def message(self, user_key: str) -> None:
        """Count a chat message of `user_key` (any message, a command too); raise Refused over the
        per-user message rate (on every replica together, when shared), and while the service is still
        full before the time a capacity refusal gave them."""
        line = self.line
        full = bool(line.waiting or line.others.waiting) or line.engine_running >= line.limit
        usage = self.limits.usage(user_key)
        try:
            self.limits.count_message(usage, service_full=full)
            if self.shared is not None:
                try:
                    await self.shared.count_message(user_key)
                except Refused:
                    self.limits.uncount_message(usage)
                    raise
        except Refused as refusal:
            self._refused(user_key, refusal)
            raise

    def _refused(self, user_key: str, refusal: Refused) -> None:
        self.line.refusals[refusal.reason] += 1
        self.accounting.refused(user_key, refusal)

    @contextlib.asynccontextmanager
    async def turn(self, user_key: str, documents: int = 0, api: bool = False) -> AsyncIterator[TurnContext]:
        """One turn of `user_key` with `documents` new uploads (`api`: an API request); raise Refused
        over a per-user limit or a period's budget (checked before anything starts)."""
        usage = self.limits.usage(user_key)
        try:
            self.limits.check(usage, documents)
        except Refused as refusal:
            self._refused(user_key, refusal)
            raise
        if not (api or documents) and (full := self.line.refusal_now()) is not None:
            self.limits.told(usage, full)  # a chat turn the line would refuse: told before any database work
            self.accounting.refused(user_key, full)
            raise full
        try:
            await self.accounting.check(user_key)
            lease = await self.shared.open_turn(user_key, documents) if self.shared is not None else None
        except Refused as refusal:
            self._refused(user_key, refusal)
            raise
        self.limits.record_documents(usage, documents)
        usage.turns += 1
        refused = False
        turn = TurnContext(user_key, usage, time.monotonic(), documents, counted=api)
        try:
            with entered_turn(turn) as context:
                yield context
        except Refused as refusal:
            refused = not turn.counted and refusal.reason in TOKEN_LIMITS  # before any engine request ran
            raise
        finally:
            if not refused:
                self._count_turn(turn)  # a turn that made no engine request counts too
            usage.turns -= 1
            if self.shared is not None:
                self.shared.close_turn(lease)

    @contextlib.asynccontextmanager
    async def admit(
        self, work: str, user_key: str | None = None, demand: Callable[[], Demand] | None = None
    ) -> AsyncIterator[Slot]:
        """The one way to the engine: a request of `work` (CHAT, DOCUMENT or API) waits for a slot in
        the shared line, runs while the body runs, and gives the slot back on every exit.

        `user_key` given (an API request): the request is a turn of that person's own (per-user
        limits). None: it belongs to the turn it runs in, if any (chat and its document parts).
        `demand`: what the request would use at most, asked only when a window of its person limits
        it; the slot's `grant` says what it may run with (grants.py).
        Raises Refused over a per-user limit or budget, when the line is full or the wait too long,
        and when the engine refuses the request for its own full queue before its first token.
        """
        turn_of = (
            self.turn(user_key, api=True) if user_key is not None else contextlib.nullcontext(current_turn())
        )
        async with turn_of as turn:
            try:
                grant = self._grant(work, turn, demand)
                self._count_started(user_key, turn)
                try:
                    async with self.line.place(work, owner=turn) as ticket:
                        slot = Slot(self, ticket, turn, grant)
                        try:
                            yield slot
                        except Exception as error:
                            if slot.tokens or not is_engine_busy(error):
                                raise
                            ahead = len(self.line.waiting)
                            wait = self.line.estimate_seconds(ahead)
                            raise self.line.refuse(ENGINE_QUEUE_FULL, ahead, wait) from error
                finally:
                    self._release(turn, grant)
            except Refused as refusal:
                if turn is not None and turn.usage is not None:
                    self.limits.told(turn.usage, refusal)  # resending earlier gets this answer at once
                if turn is not None:
                    self.accounting.refused(turn.user_key, refusal)
                raise

    def _grant(self, work: str, turn: TurnContext | None, demand: Callable[[], Demand] | None) -> Grant:
        """What a request may run with (grants.py), reserved at once in its person's windows: no await
        comes between reading what is left and holding it. Raise Refused when not even the shortest
        answer fits."""
        if demand is None or turn is None:
            return Grant()
        minute = self.limits.tokens_room(turn.usage) if turn.usage is not None and work != DOCUMENT else None
        rooms = [*([minute] if minute is not None else []), *self.accounting.rooms(turn.user_key)]
        if not rooms:
            return Grant()
        asked = demand()
        try:
            limit = answer_limit(asked, rooms, self.settings.min_cut_answer_tokens)
        except Refused as refusal:
            self.line.refusals[refusal.reason] += 1
            raise
        answer = asked.sequences * limit
        grant = Grant(asked, limit, answer if minute is not None else 0, asked.worst_case(limit))
        if turn.usage is not None:
            turn.usage.reserved_tokens += grant.answer_reserved
        self.accounting.reserve(turn.user_key, grant.budget_reserved)
        return grant

    def _count_started(self, user_key: str | None, turn: TurnContext | None) -> None:
        """An engine request was granted: an API request (`user_key`) counts as one call, a chat
        turn's first request makes it count as a turn."""
        if user_key is not None:
            self.accounting.started(user_key, True, 0)
        elif turn is not None:
            self._count_turn(turn)

    def _count_turn(self, turn: TurnContext) -> None:
        """Tell the keeper of usage about a chat turn once: when its first engine request is granted,
        or when it ends without one; a turn refused for its tokens before any request ran is not one."""
        if not turn.counted:
            turn.counted = True
            self.accounting.started(turn.user_key, False, turn.documents)

    def _release(self, turn: TurnContext | None, grant: Grant) -> None:
        """The request ended and its tokens were counted: what it held is given back."""
        if turn is None or grant.demand is None:
            return
        if turn.usage is not None:
            turn.usage.reserved_tokens -= grant.answer_reserved
        self.accounting.release(turn.user_key, grant.budget_reserved)

    def engine_finished(self, stats: StreamStats) -> None:
        """The engine's on_finish listener: a chat or document request's tokens count for the person
        whose turn it ran in (the turn travels in a context variable, into the summarizer's tasks too)."""
        turn = current_turn()
        if turn is not None:
            self.accounting.used(turn.user_key, stats.prompt_tokens, stats.output_tokens)

    def feedback(self, turn: TurnContext, show: Show) -> WaitingFeedback:
        """Status updates for a waiting turn (none when admission is off: nothing waits)."""
        return WaitingFeedback(self.line, turn, show, enabled=self.line.enabled)

    def engine(self, engine: ChatEngine, kind: str) -> AdmittedEngine:
        """`engine` as chat (kind CHAT) or documents (kind DOCUMENT) should call it."""
        return AdmittedEngine(engine, self, kind)


class Slot:
    """An admitted request's hold on the engine: its vLLM priority, what it may run with (`grant`),
    its streamed tokens, its charge."""

    def __init__(self, admission: Admission, ticket: Any, turn: TurnContext | None, grant: Grant) -> None:
        self._line = admission.line
        self._limits = admission.limits
        self._accounting = admission.accounting
        self._shared = admission.shared
        self._ticket = ticket
        self._turn = turn
        self.priority = engine_priority(admission.settings, ticket.key)  # lower is earlier; 0: priority off
        self.grant = grant
        self.tokens = 0

    def token(self) -> None:
        """The request streamed a token (chat's feed the stream pace; the first ends the prompt's read)."""
        self.tokens += 1
        self._line.note_token(self._ticket)

    def charge(self, tokens: int) -> None:
        """Count an answer's tokens against its person's tokens per minute."""
        if self._turn is not None and self._turn.usage is not None:
            self._limits.record_tokens(self._turn.usage, tokens)
            if self._shared is not None:
                self._shared.add_tokens(self._turn.user_key, tokens)

    def used(self, prompt_tokens: int, answer_tokens: int) -> None:
        """An API request's tokens, for its person's usage and budgets (chat's come from the engine:
        `Admission.engine_finished`)."""
        if self._turn is not None:
            self._accounting.used(self._turn.user_key, prompt_tokens, answer_tokens)


class AdmittedEngine:
    """A ChatEngine whose every request first takes its place in the line (`Admission.admit`).

    Everything but `generate` is the engine's own (templates, token counts, context size).
    """

    def __init__(self, engine: ChatEngine, admission: Admission, kind: str) -> None:
        self._engine = engine
        self._admission = admission
        self.kind = kind

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    async def generate(
        self, messages: list[Message], sampling: SamplingSettings, request_id: str, **options: Any
    ) -> AsyncIterator[str]:
        """Wait for a slot (refused at once when the line is full), then stream with the slot's priority.

        Other keyword `options` go to the engine's own generate unchanged.
        """
        parts: list[str] = []
        demand = self._demand(messages, sampling, options.get("answer_prefix", ""))
        async with self._admission.admit(self.kind, demand=demand) as slot:
            if (cut := slot.grant.cut) is not None:  # shorter, to fit what its person has left
                sampling = dataclasses.replace(
                    sampling, max_new_tokens=cut, min_new_tokens=min(sampling.min_new_tokens, cut)
                )
            try:
                stream = self._engine.generate(
                    messages, sampling, request_id, priority=slot.priority, **options
                )
                async with contextlib.aclosing(stream):
                    async for delta in stream:
                        slot.token()
                        parts.append(delta)
                        yield delta
            finally:
                if self.kind == CHAT and parts:  # a chat answer's tokens count against its person's share
                    slot.charge(self._engine.count_tokens("".join(parts)))

    def _demand(
        self, messages: list[Message], sampling: SamplingSettings, prefix: str
    ) -> Callable[[], Demand]:
        """The request's worst case, counted only when asked: its templated prompt, and the answer
        the engine would allow it (chat_engine.token_budget: MAX_NEW_TOKENS within the context)."""

        def demand() -> Demand:
            engine = self._engine
            prompt = len(engine.encode_chat(messages)) + (engine.count_tokens(prefix) if prefix else 0)
            return Demand(prompt, max(1, min(sampling.max_new_tokens, engine.max_model_len - prompt)))

        return demand
