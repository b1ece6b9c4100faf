"""The service's long-lived parts and their one lifecycle: settings, engine, sessions.

Chainlit's startup hook calls `start`, its shutdown hook calls `stop`; an
atexit hook covers interpreter exits that skip the shutdown hook, so the
engine's processes never outlive the app.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import time
from typing import Any

from services.chainlit_state import chainlit_session_counts
from services.config import Settings
from services.engine import ChatEngine, engine_lifespan
from services.sessions import SessionStore

logger = logging.getLogger(__name__)


class Runtime:
    """Owns the engine and the session store for the life of the process."""

    def __init__(self) -> None:
        self._stack = contextlib.AsyncExitStack()
        self.settings: Settings | None = None
        self.engine: ChatEngine | None = None
        self.sessions: SessionStore | None = None
        self.started_at = time.time()

    @property
    def ready(self) -> bool:
        return self.sessions is not None

    async def start(self, settings: Settings | None = None) -> None:
        """Read settings, start the engine, create the session store."""
        self.settings = settings or Settings.from_env()
        logger.info("settings differing from defaults: %s", self.settings.non_default() or "none")
        self.engine = await self._stack.enter_async_context(engine_lifespan(self.settings))
        atexit.register(self._shutdown_at_exit)
        self.sessions = SessionStore(self.engine, self.settings)

    async def stop(self) -> None:
        """Cancel every turn, drop every session, shut the engine down."""
        if self.sessions is not None:
            self.sessions.close_all()
        self.sessions = None
        await self._stack.aclose()
        self.engine = None
        atexit.unregister(self._shutdown_at_exit)

    def _shutdown_at_exit(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()

    def status(self) -> dict[str, Any]:
        """Counts that show whether anything is held that should not be."""
        if not self.ready:
            return {"ready": False}
        assert self.engine is not None and self.sessions is not None
        return {
            "ready": True,
            "engine_alive": self.engine.alive,
            "engine_unfinished_requests": self.engine.unfinished_requests(),
            "sessions": len(self.sessions),
            "turns_in_flight": self.sessions.turns_in_flight(),
            "sessions_dropped_total": dict(self.sessions.dropped_total),
            **chainlit_session_counts(),
            "uptime_seconds": round(time.time() - self.started_at, 1),
        }
