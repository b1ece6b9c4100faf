"""Per-session chat state in a TTL-bounded LRU, and the lifetime of a chat turn.

`SessionStore.turn` is the one place that ties a turn to its session: it
cancels the previous turn (one generation in flight per session), registers
the running task so that stop, disconnect, eviction and expiry can cancel it,
and the engine aborts the request whenever a turn's stream ends early.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from cachetools import TTLCache

from services.chat.session import ChatSession
from services.config import Settings
from services.engine.chat_engine import SamplingSettings

logger = logging.getLogger(__name__)

# How long a new turn waits for the turn it cancelled to finish its cleanup.
PREVIOUS_TURN_GRACE_SECONDS = 2.0


class _SessionCache(TTLCache):
    """A TTLCache that hands every evicted or expired session to `on_drop`."""

    def __init__(self, maxsize: int, ttl: float, timer: Callable[[], float], on_drop: Callable) -> None:
        super().__init__(maxsize=maxsize, ttl=ttl, timer=timer)
        self._on_drop = on_drop

    def popitem(self):  # called by cachetools when the LRU bound is hit
        key, session = super().popitem()
        self._on_drop(session, "evicted")
        return key, session

    def expire(self, time=None):
        expired = super().expire(time)
        for _, session in expired:
            self._on_drop(session, "expired")
        return expired


class SessionStore:
    """All sessions of the process. Bounded by MAX_SESSIONS and SESSION_TTL_SECONDS."""

    def __init__(self, settings: Settings, timer: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self._sessions = _SessionCache(
            settings.max_sessions, settings.session_ttl_seconds, timer, self._release
        )
        self.dropped_total: dict[str, int] = {"evicted": 0, "expired": 0, "closed": 0, "not_reconnected": 0}
        self._timer = timer

    # --- lifecycle -----------------------------------------------------------
    def open(self, session_id: str, user_identifier: str | None = None) -> ChatSession:
        """The session for `session_id`, created on first use; marks it as used now (and connected)."""
        self._sessions.expire()
        session = self._sessions.get(session_id)
        if session is None:
            s = self.settings
            session = ChatSession(
                session_id=session_id,
                sampling=SamplingSettings(s.temperature, s.top_p, s.max_new_tokens),
                system_prompt=s.system_prompt,
                history=deque(maxlen=s.max_history_messages),
                user_identifier=user_identifier,
            )
        session.reconnect_deadline = None
        self._sessions[session_id] = session  # (re)insert: refreshes TTL and LRU order
        return session

    def get(self, session_id: str) -> ChatSession | None:
        return self._sessions.get(session_id)

    def close(self, session_id: str) -> None:
        """Drop a session now (disconnect): cancel its turn, free its state."""
        session = self._sessions.pop(session_id, None)
        if session is not None:
            self._release(session, "closed")

    def disconnect(self, session_id: str, keep_seconds: float) -> None:
        """The page went away: cancel the running turn now (aborting its engine request), but keep
        the conversation `keep_seconds` (Chainlit's session_timeout) for the page to reconnect."""
        session = self._sessions.get(session_id)
        if session is None:
            return
        if session.cancel_turn() is not None:
            logger.info("session %s disconnected: cancelled its running turn", session_id[:8])
        session.reconnect_deadline = self._timer() + keep_seconds

    def expire(self) -> int:
        """Drop sessions idle past the TTL and disconnected ones not back in time; return how many."""
        expired = len(self._sessions.expire())
        now = self._timer()
        gone = [
            key
            for key, s in self._sessions.items()
            if s.reconnect_deadline is not None and s.reconnect_deadline <= now
        ]
        for session_id in gone:
            session = self._sessions.pop(session_id)
            self._release(session, "not_reconnected")
        return expired + len(gone)

    def close_all(self) -> None:
        for session_id in list(self._sessions.keys()):
            self.close(session_id)

    def _release(self, session: ChatSession, reason: str) -> None:
        self.dropped_total[reason] += 1
        if session.release() is not None:
            logger.info("session %s %s: cancelled its running turn", session.session_id[:8], reason)

    def __len__(self) -> int:
        return len(self._sessions)

    def awaiting_reconnect(self) -> int:
        """Sessions whose page went away, kept until their reconnect deadline."""
        return sum(1 for s in self._sessions.values() if s.reconnect_deadline is not None)

    def turns_in_flight(self) -> int:
        return sum(1 for s in self._sessions.values() if s.turn_task is not None and not s.turn_task.done())

    # --- settings ------------------------------------------------------------
    def update_settings(self, session: ChatSession, values: Mapping[str, Any]) -> None:
        """Apply chat settings from the UI (any subset), clamped to the service limits.

        Unknown keys and values that are not numbers are ignored.
        """
        current = session.sampling

        def number(key: str, default: float, low: float, high: float) -> float:
            try:
                value = float(values.get(key, default))
            except (TypeError, ValueError):
                return default
            return min(max(value, low), high) if math.isfinite(value) else default

        session.sampling = SamplingSettings(
            temperature=number("temperature", current.temperature, 0.0, 2.0),
            top_p=number("top_p", current.top_p, 0.01, 1.0),
            max_new_tokens=int(
                number("max_new_tokens", current.max_new_tokens, 1, self.settings.max_new_tokens_limit)
            ),
        )
        if isinstance(values.get("system_prompt"), str):
            session.system_prompt = values["system_prompt"].strip() or self.settings.system_prompt

    # --- turns ---------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def turn(self, session: ChatSession) -> AsyncIterator[str]:
        """Run one turn in the current task; yields its engine request id.

        Cancels the session's previous turn first. Anything that cancels the
        task (Stop, disconnect, eviction, a newer message) ends the stream, and
        `ChatEngine.generate` aborts the engine request on the way out.
        """
        previous = session.cancel_turn()
        if previous is not None:
            await asyncio.wait([previous], timeout=PREVIOUS_TURN_GRACE_SECONDS)
        task = asyncio.current_task()
        request_id = f"chat-{session.session_id[:8]}-{uuid.uuid4().hex[:12]}"
        session.turn_task = task
        try:
            yield request_id
        finally:
            if session.turn_task is task:
                session.turn_task = None
            if self._sessions.get(session.session_id) is session:
                self._sessions[session.session_id] = session  # activity refreshes the TTL
