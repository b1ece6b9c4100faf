"""A chat page as a turn sees it (services/web/chat_page.py is Chainlit's): the answer's message, the
reading step, and the page's own events."""

from __future__ import annotations

import contextlib
from typing import Any, Protocol

from services.admission.feedback import Show
from services.admission.refusals import Refused
from services.chat.session import ChatSession
from services.documents.progress import Progress


class Reply(Protocol):
    """The answer's message on the page, streamed into, sent at the end of the turn."""

    id: str
    content: str
    metadata: dict[str, Any]

    async def stream_token(self, token: str) -> None: ...

    async def send(self) -> Any: ...

    async def update(self) -> Any: ...


class Step(Protocol):
    output: str


class Page(Protocol):
    """The chat page of one tab, as a turn sees it."""

    @property
    def session_id(self) -> str: ...

    @property
    def user_identifier(self) -> str | None: ...

    @property
    def thread_id(self) -> str: ...

    @property
    def chosen_model(self) -> str | None:
        """The model the page asks for (its chat profile); None: no choice made."""
        ...

    def person(self) -> str:
        """Whose share a turn counts against (admission's per-user limits)."""
        ...

    def reply(self) -> Reply:
        """A new, empty answer, marked as part of the model's history."""
        ...

    def status(self) -> Show:
        """Where a waiting turn's status is shown (its place in line)."""
        ...

    def summary_progress(self) -> Progress: ...

    def reading(self) -> contextlib.AbstractAsyncContextManager[Step]:
        """A step shown while uploads are read."""
        ...

    async def refused(self, refusal: Refused) -> None: ...

    async def error(self, text: str) -> None: ...

    async def notice(self, text: str) -> None: ...

    async def send_settings(self, session: ChatSession, max_new_tokens_limit: int) -> None: ...

    def keep_settings(self, values: dict[str, Any]) -> None:
        """What the page keeps as the conversation's chat settings."""
        ...

    def forget(self) -> None:
        """Drop the page framework's own copy of the session's messages."""
        ...

    async def offer_regenerate(self, answer_id: str | None) -> None:
        """The Regenerate button on this answer only (None: on none)."""
        ...

    async def remove_messages(self, ids: list[str]) -> None: ...

    async def show_edited(self, message_id: str, text: str) -> None: ...

    def run(self, message_id: str | None) -> contextlib.AbstractAsyncContextManager[Any]:
        """The run an answer belongs to, as the message handler makes one (its answer gets feedback)."""
        ...
