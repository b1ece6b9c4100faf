"""Workarounds for per-session state Chainlit 2.12 keeps in module-level dicts."""

from __future__ import annotations

from chainlit.chat_context import chat_contexts
from chainlit.session import ws_sessions_id
from chainlit.user_session import user_sessions


def forget_chat_context(session_id: str) -> None:
    """Drop Chainlit's copy of a session's messages.

    Chainlit appends every sent message to `chat_contexts[session_id]` and never
    removes the key (upstream issue #2951). We keep our own bounded history, so
    this copy is dropped after each turn and when the chat ends.
    """
    chat_contexts.pop(session_id, None)


def chainlit_session_counts() -> dict[str, int]:
    """Sizes of Chainlit's own per-session dicts (they must not grow without bound)."""
    return {
        "chainlit_ws_sessions": len(ws_sessions_id),
        "chainlit_user_sessions": len(user_sessions),
        "chainlit_chat_contexts": len(chat_contexts),
    }
