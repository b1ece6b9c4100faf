"""One user's conversation as the server holds it: settings, bounded history, document, running turn."""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field

from services.documents.planning import DocumentPlan
from services.engine import Message, SamplingSettings


@dataclass
class SessionDocument:
    """The document a session talks about; freed with the session."""

    name: str
    text: str
    tokens: int
    chunks: tuple[str, ...] = ()  # retrieval chunks, made on first need
    chunk_tokens: int = 0
    language: str | None = None  # detected when attached
    plan: DocumentPlan | None = None  # whole or in parts, decided when attached (planning.py)


@dataclass
class ChatSession:
    """One user's conversation: settings, bounded history, the turn in flight."""

    session_id: str
    sampling: SamplingSettings
    system_prompt: str
    history: deque[Message]
    turn_task: asyncio.Task | None = None
    # The stored message (Chainlit step) id of each history message, aligned with `history`
    # (services/chat/branch.py keeps them together): what an edit or a regenerate cuts at.
    history_ids: deque[str | None] = field(default_factory=deque)
    running_turn: tuple[str | None, str | None, str] | None = None  # (message id, answer id, text)
    document: SessionDocument | None = None
    user_identifier: str | None = None  # the signed-in user (None when anonymous): per-user limits, history
    reconnect_deadline: float | None = None  # set while disconnected: dropped when the page has not returned
    history_outage_told: int = 0  # the history outage this session was last told about (0 = none)
    last_used: float = 0.0  # monotonic; opening the session or ending a turn refreshes it
    model: str = ""  # the served model that answers (model_choice.py); empty = the default

    def __post_init__(self) -> None:
        self.history_ids = deque(self.history_ids, maxlen=self.history.maxlen)

    @property
    def busy(self) -> bool:
        """A turn is running (or waiting for its place)."""
        return self.turn_task is not None and not self.turn_task.done()

    def cancel_turn(self) -> asyncio.Task | None:
        """Cancel the running turn, if any; return it so the caller may await it."""
        task = self.turn_task
        if task is not None and not task.done():
            task.cancel()
            return task
        return None

    def release(self) -> asyncio.Task | None:
        """Cancel the running turn and free the conversation's state; return the cancelled turn."""
        cancelled = self.cancel_turn()
        self.history.clear()
        self.history_ids.clear()
        self.document = None
        return cancelled
