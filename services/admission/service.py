"""The one place where overload rules apply: turns open here (per-user limits), and every engine
request of chat and documents goes through `AdmittedEngine.generate` (queue, priority, capacity).

A turn's context (who asks, which of its requests wait in our queue) travels in a
context variable, so the summarizer's parallel part requests, which run in
tasks of their own, are accounted to the turn that started them without being
passed anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from services.admission.capacity import DecodeCapacity
from services.admission.context import TurnContext, current_turn, entered_turn
from services.admission.feedback import Show, WaitingFeedback
from services.admission.limits import UserLimits
from services.admission.refusals import ENGINE_QUEUE_FULL, Refused
from services.admission.waiting_line import CHAT, AdmissionGate
from services.config import Settings
from services.engine.chat_engine import ChatEngine, Message, SamplingSettings
from services.engine.errors import is_engine_busy
from services.engine.load import EngineLoad

logger = logging.getLogger(__name__)

REFRESH_SECONDS = 1.0  # how often the running limit is re-derived from the engine's numbers


class Admission:
    """Owns the capacity model, the queue, the per-user limits, and the task that refreshes the limit."""

    def __init__(self, settings: Settings, load: EngineLoad, max_running: int) -> None:
        self.settings = settings
        self.load = load
        self.capacity = DecodeCapacity(
            settings.reading_pace_tokens_per_second * settings.reading_pace_headroom, max_running
        )
        self.gate = AdmissionGate(settings, self.capacity)
        self.limits = UserLimits(settings)
        self.last_overload_at: float | None = None  # monotonic time of the latest capacity refusal
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

    def refresh(self) -> None:
        """Learn from the engine's latest windows, then admit whoever the new limit lets in."""
        self.capacity.update(self.load)
        self.gate.pace.adjust(self.gate.running_total, self.capacity.limit)
        self.gate.admit_waiting()

    @property
    def overloaded(self) -> bool:
        """Someone waits in our queue, or a request was refused for capacity in the last minute."""
        recent = self.last_overload_at is not None and time.monotonic() - self.last_overload_at < 60
        return bool(self.gate.waiting) or recent

    def status(self) -> dict[str, Any]:
        """What /status shows of admission: the limit, the queue, refusals, the learned decode speed."""
        gate = self.gate
        return {
            "enabled": gate.enabled,
            "running": dict(gate.running),
            "running_limit": gate.limit if gate.enabled else None,
            "waiting": len(gate.waiting),
            "admitted_total": gate.admitted_total,
            "refusals_total": dict(gate.refusals),
            "service_seconds": {kind: round(value, 2) for kind, value in gate.service_seconds.items()},
            "seconds_per_token_by_batch": self.capacity.seconds_per_token(),
            "slowdown_vs_warm_up": round(self.capacity.slowdown, 2),
            "stream_pace": gate.pace.status(),
            "users_tracked": len(self.limits),
        }

    def note_refusal(self, refusal: Refused) -> None:
        """A request was refused for lack of capacity (already counted by the gate)."""
        self.last_overload_at = time.monotonic()

    def message(self, user_key: str) -> None:
        """Count a chat message of `user_key` (any message, a command too); raise Refused over the
        per-user message rate."""
        try:
            self.limits.count_message(self.limits.usage(user_key))
        except Refused as refusal:
            self.gate.refusals[refusal.reason] += 1
            raise

    @contextlib.asynccontextmanager
    async def turn(self, user_key: str, documents: int = 0) -> AsyncIterator[TurnContext]:
        """One turn of `user_key` with `documents` new uploads; raise Refused over a per-user limit."""
        usage = self.limits.usage(user_key)
        try:
            self.limits.check(usage, documents)
        except Refused as refusal:
            self.gate.refusals[refusal.reason] += 1
            raise
        self.limits.record_documents(usage, documents)
        usage.turns += 1
        try:
            with entered_turn(TurnContext(user_key, usage, time.monotonic())) as context:
                yield context
        finally:
            usage.turns -= 1

    def feedback(self, turn: TurnContext, show: Show) -> WaitingFeedback:
        """Status updates for a waiting turn (none when admission is off: nothing waits)."""
        return WaitingFeedback(self.gate, turn, show, enabled=self.gate.enabled)

    def engine(self, engine: ChatEngine, kind: str) -> AdmittedEngine:
        """`engine` as chat (kind CHAT) or documents (kind DOCUMENT) should call it."""
        return AdmittedEngine(engine, self, kind)


class AdmittedEngine:
    """A ChatEngine whose every request first takes its place in the queue.

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
        """Wait for a slot (refused at once when the queue is full), then stream with the slot's priority.

        Other keyword `options` go to the engine's own generate unchanged.
        """
        gate, context = self._admission.gate, current_turn()
        ticket = gate.ticket(self.kind)
        try:
            if context is not None:
                context.waiting.add(ticket)
            try:
                await gate.enter(ticket)
            finally:
                if context is not None:
                    context.waiting.discard(ticket)
        except Refused as refusal:
            self._admission.note_refusal(refusal)
            raise
        parts: list[str] = []
        try:
            priority = gate.engine_priority(ticket)
            stream = self._engine.generate(messages, sampling, request_id, priority=priority, **options)
            async with contextlib.aclosing(stream):
                async for delta in stream:
                    gate.note_token(ticket)
                    parts.append(delta)
                    yield delta
        except Exception as error:
            if not is_engine_busy(error) or parts:
                raise
            refusal = gate.refuse(
                ENGINE_QUEUE_FULL, len(gate.waiting), gate.estimate_seconds(len(gate.waiting))
            )
            self._admission.note_refusal(refusal)
            raise refusal from error
        finally:
            gate.release(ticket)
            self._charge(context, parts)

    def _charge(self, context: TurnContext | None, parts: list[str]) -> None:
        """A chat answer's tokens count against its user's tokens per minute."""
        if self.kind == CHAT and context is not None and context.usage is not None and parts:
            self._admission.limits.record_tokens(context.usage, self._engine.count_tokens("".join(parts)))
