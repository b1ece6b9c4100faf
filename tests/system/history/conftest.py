"""What the history tests share: people and conversations written through the app's data layer, and
the sidebar's search as the page asks it (no server, no model)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from chainlit.types import Pagination, ThreadFilter
from chainlit.user import User

from services.history import conversations
from services.history.service import History

START = datetime(2026, 1, 1, tzinfo=UTC)  # the first message of `conversation`


async def new_user(history: History, name: str) -> str:
    assert history.layer is not None
    user = await history.layer.create_user(User(identifier=name, metadata={"role": "user"}))
    assert user is not None
    return user.id


async def people(history: History) -> tuple[str, str]:
    """Two new people, Alice and Bob (their names unique to the call)."""
    suffix = uuid.uuid4().hex[:8]
    return await new_user(history, f"alice-{suffix}"), await new_user(history, f"bob-{suffix}")


async def conversation(
    history: History, user_id: str | None, name: str, messages: list[str], minutes: int = 0
) -> str:
    """A conversation stored as the app stores one (thread, then its messages through create_step);
    its messages are `minutes` after START, so later ones are more recent."""
    layer = history.layer
    assert layer is not None
    thread_id = str(uuid.uuid4())
    await layer.update_thread(thread_id, name=name, user_id=user_id)
    for i, output in enumerate(messages):
        at = conversations.timestamp(START + timedelta(minutes=minutes, seconds=i))
        await layer.create_step({
            "id": str(uuid.uuid4()), "threadId": thread_id, "name": "User" if i % 2 == 0 else "vLLM Chat",
            "type": "user_message" if i % 2 == 0 else "assistant_message", "output": output, "createdAt": at,
        })  # fmt: skip
    return thread_id


async def found(history: History, user_id: str, search: str, first: int = 20) -> list[str]:
    """The ids of `user_id`'s conversations the sidebar's search for `search` lists."""
    assert history.layer is not None
    page = await history.layer.list_threads(
        Pagination(first=first), ThreadFilter(userId=user_id, search=search)
    )
    return [thread["id"] for thread in page.data]
