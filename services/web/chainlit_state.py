"""Workarounds for per-session state Chainlit 2.12 keeps in module-level dicts, and their sizes."""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from typing import Any
from urllib.parse import parse_qs

from chainlit.chat_context import chat_contexts
from chainlit.context import ChainlitContextException, context, init_ws_context
from chainlit.message import ErrorMessage
from chainlit.server import sio
from chainlit.session import WebsocketSession, ws_sessions_id
from chainlit.user_session import user_sessions
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector


def forget_chat_context(session_id: str) -> None:
    """Drop Chainlit's copy of a session's messages.

    Chainlit appends every sent message to `chat_contexts[session_id]` and never
    removes the key (upstream issue #2951). We keep our own bounded history, so
    this copy is dropped after each turn and when the chat ends.
    """
    chat_contexts.pop(session_id, None)


async def drop_chainlit_session(session_id: str) -> None:
    """Chainlit's copy of a session whose page is not coming back: its entries and its files folder
    (what Chainlit's own session_timeout would clear later)."""
    user_sessions.pop(session_id, None)
    forget_chat_context(session_id)
    if (session := WebsocketSession.get_by_id(session_id)) is not None:
        await session.delete()


def current_user_identifier() -> str | None:
    """The signed-in user of the Chainlit session being served; None when anonymous or outside one.

    The stable identity for anything per user (history, limits); ChatSession.user_identifier holds
    the same value for code that has the session instead of Chainlit's context.
    """
    try:
        user = context.session.user
    except ChainlitContextException:
        return None
    return getattr(user, "identifier", None)


def chainlit_session_counts() -> dict[str, int]:
    """Sizes of Chainlit's own per-session dicts (they must not grow without bound)."""
    return {
        "chainlit_ws_sessions": len(ws_sessions_id),
        "chainlit_user_sessions": len(user_sessions),
        "chainlit_chat_contexts": len(chat_contexts),
    }


class ChainlitStateCollector(Collector):
    """`chat_chainlit_dict_entries{dict=...}`: the sizes above, for /metrics."""

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "chat_chainlit_dict_entries", "Entries in Chainlit's per-session dicts.", labels=["dict"]
        )
        for name, count in chainlit_session_counts().items():
            family.add_metric([name.removeprefix("chainlit_")], count)
        yield family


def socket_connected(session_id: str) -> bool:
    """Whether the page with this session id has its socket open now (Chainlit keeps a session whose
    socket closed for session_timeout, for a reconnect)."""
    session = WebsocketSession.get_by_id(session_id)
    return session is not None and sio.manager.is_connected(session.socket_id, "/")


def page_connected(session_id: str) -> bool:
    """Whether Chainlit knows the session: its page connected, or gone less than session_timeout ago
    (socket_connected says which)."""
    return WebsocketSession.get_by_id(session_id) is not None


async def tell_uploader(scope: MutableMapping[str, Any], text: str) -> None:
    """Show `text` in the chat of the session an HTTP upload came from (`?session_id=`)."""
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    session_id = (query.get("session_id") or [""])[0]
    session = WebsocketSession.get_by_id(session_id) if session_id else None
    if session is not None:
        init_ws_context(session)
        await ErrorMessage(content=f"Upload refused. {text}").send()
