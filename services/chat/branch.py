"""Where a conversation branches (pure logic): each history message keeps the id of its stored message
(the Chainlit step the page shows), so an edit cuts the history at the edited message and everything
after it, and a regenerate drops the last exchange to answer its message again.

Every change to a session's history goes through here, so `history` and `history_ids` stay aligned.
Code that clears the history, or adds to it while it is below its bound, without this module gets
unknown ids (None) for what it added; adding to a full history without it would shift the ids.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass

from services.chat.session import ChatSession
from services.engine import Message


@dataclass(frozen=True)
class LastTurn:
    """The exchange a regenerate answers again: its message (id and text) and its answer's id."""

    message_id: str | None
    answer_id: str
    text: str


def _align(session: ChatSession) -> None:
    """Ids for messages added without one (unknown), or ids of messages cleared without them."""
    ids = session.history_ids
    history = session.history
    while len(ids) > len(history):
        ids.popleft()
    if len(ids) < len(history):
        ids.extendleft([None] * (len(history) - len(ids)))


def record(session: ChatSession, message: Message, step_id: str | None) -> None:
    """Add one message (and the id of the stored message it is) to the session's history."""
    _align(session)
    session.history.append(message)
    session.history_ids.append(step_id)


def restore(session: ChatSession, messages: Iterable[tuple[Message, str | None]]) -> None:
    """Replace the history with these messages (oldest first), the newest that fit its bound."""
    session.history.clear()
    session.history_ids.clear()
    for message, step_id in messages:
        record(session, message, step_id)


def knows_user_message(session: ChatSession, step_id: str) -> bool:
    """Whether `step_id` is a user message of this session: in its history, or the one being answered."""
    running = session.running_turn
    if session.busy and running is not None and running[0] == step_id:
        return True
    _align(session)
    return any(
        known == step_id and message["role"] == "user"
        for message, known in zip(session.history, session.history_ids, strict=True)
    )


def rewind(session: ChatSession, cut_from: Collection[str]) -> list[str | None]:
    """Drop the history from its first message whose id is in `cut_from` on; return the ids of the
    messages that went, oldest first (None for one without an id)."""
    _align(session)
    for index, step_id in enumerate(session.history_ids):
        if step_id is not None and step_id in cut_from:
            dropped = list(session.history_ids)[index:]
            for _ in dropped:
                session.history.pop()
                session.history_ids.pop()
            return dropped
    return []


def last_turn(session: ChatSession) -> LastTurn | None:
    """The turn a regenerate may answer again: the one running, else the last answered exchange
    (None when the last message got no answer the model gave: refused, failed, stopped empty)."""
    running = session.running_turn
    if session.busy and running is not None:
        message_id, answer_id, text = running
        return LastTurn(message_id, answer_id, text) if answer_id else None
    _align(session)
    if len(session.history) < 2:
        return None
    question = session.history[-2]
    answer = session.history[-1]
    answer_id = session.history_ids[-1]
    if question["role"] != "user" or answer["role"] != "assistant" or answer_id is None:
        return None
    return LastTurn(session.history_ids[-2], answer_id, question["content"])
