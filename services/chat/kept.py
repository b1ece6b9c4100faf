"""What is kept with a conversation, as a chat turn needs it (services/history implements it): the
notice about saving, its document, restoring it into a session, and cutting it back to a branch point
(services/chat/rewinds.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from services.chat.session import ChatSession, SessionDocument
from services.chat.store import SessionStore


class KeptConversations(Protocol):
    """What is kept with a conversation (services/history)."""

    enabled: bool

    def notice_for(self, session: ChatSession) -> str | None: ...

    async def save_document(self, thread_id: str, document: SessionDocument) -> Any: ...

    async def restore(
        self, sessions: SessionStore, session: ChatSession, thread: Mapping[str, Any]
    ) -> None: ...

    async def owns_user_message(self, thread_id: str, user: str | None, step_id: str) -> bool: ...

    async def cut_branch(
        self, thread_id: str, step_id: str, keep_step: bool, text: str | None
    ) -> list[str] | None:
        """Delete the stored messages from `step_id` on (after it when `keep_step`, which then gets
        `text`); the ids deleted, None when nothing could be changed (history unavailable)."""
        ...


class NothingKept:
    """No conversation is kept (a service built without sign-in and history: tests, benchmarks)."""

    enabled = False

    def notice_for(self, session: ChatSession) -> str | None:
        return None

    async def save_document(self, thread_id: str, document: SessionDocument) -> None:
        pass

    async def restore(self, sessions: SessionStore, session: ChatSession, thread: Mapping[str, Any]) -> None:
        pass

    async def owns_user_message(self, thread_id: str, user: str | None, step_id: str) -> bool:
        return False

    async def cut_branch(self, thread_id: str, step_id: str, keep_step: bool, text: str | None) -> list[str]:
        return []
