"""Per-session chat state, bounded by count (idle sessions evicted first) and idle time, and the
lifetime of a chat turn.

`SessionStore.turn` is the one place that ties a turn to its session: it
cancels the previous turn (one generation in flight per session), registers
the running task so that stop, disconnect, eviction and expiry can cancel it,
and the engine aborts the request whenever a turn's stream ends early.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from services.admission.refusals import SESSIONS_FULL, Refused
from services.chat.session import ChatSession
from services.config import Settings
from services.engine import SamplingSettings

logger = logging.getLogger(__name__)

# How long a new turn waits for the turn it cancelled to finish its cleanup.
PREVIOUS_TURN_GRACE_SECONDS = 2.0
# Sessions whose page went away kept for its return (Chainlit's session_timeout) at most: beyond it the
# longest gone are dropped at once, Chainlit's copy too, so a storm of closed tabs holds no more.
MAX_SESSIONS_AWAITING_RECONNECT = 200


def session_sampling(settings: Settings) -> SamplingSettings:
    """The sampling a new session starts with (the user may tune it afterwards)."""
    s = settings
    return SamplingSettings(
        s.temperature, s.top_p, s.max_new_tokens, s.repetition_penalty, s.frequency_penalty
    )


# The chat settings the page offers (web/chat_page.py send_settings), by kind: the socket keeps no others.
# save_as_default is the presets' switch (web/presets_chat.py).
CHAT_SETTING_KINDS: dict[str, type] = {
    "temperature": float,
    "top_p": float,
    "max_new_tokens": float,
    "system_prompt": str,
    "save_as_default": bool,
}


class SessionStore:
    """All sessions of the process. Bounded by MAX_SESSIONS and SESSION_TTL_SECONDS.

    At MAX_SESSIONS a new session takes the place of the least recently used idle
    one; a session whose turn is running is never evicted. When every session is
    busy, the new one is refused (`Refused`, with a message for its user).
    """

    def __init__(self, settings: Settings, timer: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self.timer = timer
        self._sessions: OrderedDict[str, ChatSession] = OrderedDict()  # least recently used first
        reasons = ("evicted", "expired", "closed", "not_reconnected", "reconnect_bound")
        self.dropped_total: dict[str, int] = dict.fromkeys(reasons, 0)
        self.refused_total = 0

    # --- lifecycle -----------------------------------------------------------
    def open(self, session_id: str, user_identifier: str | None = None) -> ChatSession:
        """The session for `session_id`, created on first use; marks it as used now (and connected).

        Raises Refused when the store is full and no session is idle.
        """
        self.expire()
        session = self._sessions.get(session_id)
        if session is None:
            self._make_room()
            s = self.settings
            session = ChatSession(
                session_id=session_id,
                sampling=session_sampling(s),
                system_prompt=s.system_prompt,
                history=deque(maxlen=s.max_history_messages),
                user_identifier=user_identifier,
            )
        session.reconnect_deadline = None
        self._touch(session)
        return session

    def _touch(self, session: ChatSession) -> None:
        session.last_used = self.timer()
        self._sessions[session.session_id] = session
        self._sessions.move_to_end(session.session_id)

    def _make_room(self) -> None:
        """When full, evict a session whose page went away, else the least recently used idle one;
        refuse when none is idle."""
        if len(self._sessions) < self.settings.max_sessions:
            return
        idle = [s for s in self._sessions.values() if not s.busy]  # least recently used first
        if idle:
            gone = [s for s in idle if s.reconnect_deadline is not None]
            victim = (gone or idle)[0]
            del self._sessions[victim.session_id]
            self._release(victim, "evicted")
            return
        self.refused_total += 1
        raise Refused(
            SESSIONS_FULL,
            f"The service is holding its limit of {self.settings.max_sessions:,} conversations, and all "
            "of them are answering right now. Please try again in a minute.",
            60.0,
        )

    def get(self, session_id: str) -> ChatSession | None:
        return self._sessions.get(session_id)

    def close(self, session_id: str) -> None:
        """Drop a session now (disconnect): cancel its turn, free its state."""
        session = self._sessions.pop(session_id, None)
        if session is not None:
            self._release(session, "closed")

    def stop(self, session_id: str) -> None:
        """The user pressed Stop: cancel the running turn (aborting its engine request)."""
        if (session := self._sessions.get(session_id)) is not None:
            self._cancel_turn(session, "stopped")

    def disconnect(self, session_id: str, keep_seconds: float) -> list[str]:
        """The page went away: cancel the running turn now (aborting its engine request), but keep
        the conversation `keep_seconds` (Chainlit's session_timeout) for the page to reconnect.
        Returns the ids of sessions dropped because more than MAX_SESSIONS_AWAITING_RECONNECT waited
        (the longest gone first): the page framework's copies go too."""
        session = self._sessions.get(session_id)
        if session is None:
            return []
        self._cancel_turn(session, "disconnected")
        session.reconnect_deadline = self.timer() + keep_seconds
        gone = self._awaiting_reconnect()
        over = len(gone) - MAX_SESSIONS_AWAITING_RECONNECT
        dropped = sorted(gone, key=lambda s: s.reconnect_deadline or 0)[: max(0, over)]
        for stale in dropped:
            del self._sessions[stale.session_id]
            self._release(stale, "reconnect_bound")
        return [stale.session_id for stale in dropped]

    def believed_connected(self) -> list[str]:
        """Ids of the sessions whose page is taken to be there: no disconnect was seen for them."""
        return [s.session_id for s in self._sessions.values() if s.reconnect_deadline is None]

    def expire(self) -> int:
        """Drop sessions idle past the TTL and disconnected ones not back in time; return how many.

        A turn that has run for longer than the TTL counts as abandoned: it is cancelled.
        """
        now = self.timer()
        deadline = now - self.settings.session_ttl_seconds
        expired = []
        for session in self._sessions.values():  # least recently used first
            if session.last_used > deadline:
                break
            expired.append(session)
        expired_ids = {s.session_id for s in expired}
        gone = [
            s
            for s in self._sessions.values()
            if s.reconnect_deadline is not None
            and s.reconnect_deadline <= now
            and s.session_id not in expired_ids
        ]
        for session, reason in [(s, "expired") for s in expired] + [(s, "not_reconnected") for s in gone]:
            del self._sessions[session.session_id]
            self._release(session, reason)
        return len(expired) + len(gone)

    def close_all(self) -> None:
        for session_id in list(self._sessions.keys()):
            self.close(session_id)

    @staticmethod
    def _cancel_turn(session: ChatSession, why: str) -> None:
        if session.cancel_turn() is not None:
            logger.info("session %s %s: cancelled its running turn", session.session_id[:8], why)

    def _release(self, session: ChatSession, reason: str) -> None:
        self.dropped_total[reason] += 1
        if session.release() is not None:
            logger.info("session %s %s: cancelled its running turn", session.session_id[:8], reason)

    def __len__(self) -> int:
        return len(self._sessions)

    def awaiting_reconnect(self) -> int:
        """Sessions whose page went away and may still come back: past its deadline a session no
        longer counts (Chainlit drops its own copy then), though the next expiry round frees it."""
        return len(self._awaiting_reconnect())

    def _awaiting_reconnect(self) -> list[ChatSession]:
        now = self.timer()
        return [
            s
            for s in self._sessions.values()
            if s.reconnect_deadline is not None and s.reconnect_deadline > now
        ]

    def turns_in_flight(self) -> int:
        return sum(1 for s in self._sessions.values() if s.busy)

    # --- settings ------------------------------------------------------------
    def update_settings(self, session: ChatSession, values: Mapping[str, Any]) -> None:
        """Apply chat settings from the UI (any subset), clamped to the service limits.

        Unknown keys, values that are not numbers and a system prompt longer than a message may be
        are ignored.
        """
        current = session.sampling

        def number(key: str, default: float, low: float, high: float) -> float:
            try:
                value = float(values.get(key, default))
            except (TypeError, ValueError):
                return default
            return min(max(value, low), high) if math.isfinite(value) else default

        session.sampling = dataclasses.replace(
            current,
            temperature=number("temperature", current.temperature, 0.0, 2.0),
            top_p=number("top_p", current.top_p, 0.01, 1.0),
            max_new_tokens=int(
                number("max_new_tokens", current.max_new_tokens, 1, self.settings.max_new_tokens_limit)
            ),
        )
        prompt = values.get("system_prompt")
        if isinstance(prompt, str) and len(prompt) <= self.settings.max_message_chars:
            session.system_prompt = prompt.strip() or self.settings.system_prompt

    @staticmethod
    def chat_settings(session: ChatSession) -> dict[str, Any]:
        """The chat settings in effect, by the ids of the settings panel's widgets."""
        sampling = session.sampling
        return {
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "max_new_tokens": sampling.max_new_tokens,
            "system_prompt": session.system_prompt,
        }

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
                self._touch(session)  # activity refreshes the TTL
