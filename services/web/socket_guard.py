"""Chat messages checked before Chainlit handles, and stores, them.

Chainlit 2.12's `client_message` handler stores a message (emitter.process_message -> Message._create
-> the data layer's create_step) before the app's on_message sees it, so a check in on_message comes
too late: 20 messages of 900 KB sent in 0.3 s were all stored. Its handlers are wrapped here, through
`sio.handlers["/"]` as client_ids.py wraps `connect`:
- every `client_message` and `edit_message` counts against its sender's USER_MESSAGES_PER_MINUTE
  (commands too: they are messages); one over it, one over MAX_MESSAGE_CHARS, and one that is not
  what the page sends are refused with an error in the sender's chat, sent only to them: nothing is
  stored and Chainlit never sees it;
- a message is rebuilt as the page builds it (client_messages.py): a client cannot store an assistant
  message, our answer marker or another person's name in its history; an id already stored is refused
  (Chainlit's step upsert would overwrite that message, in whichever conversation holds it);
- `edit_message` is refused unless the edit feature is on (Chainlit's handler does not check); an
  edit of the right shape and size goes to the app (`edit`: services/chat/rewinds.py, which accepts
  only one's own user messages of this conversation), never to Chainlit's handler: that one walks
  Chainlit's copy of the chat (`chat_context`), which this app empties after every turn and a reload
  starts empty, so it found no message, deleted nothing stored and answered `None`;
- a message sends its files (upload_bounds.py: they no longer count against the unsent-upload bounds
  and are deleted once the message has been handled); one naming a file the session no longer holds
  (deleted unsent after UNSENT_UPLOAD_SECONDS, sent before, or uploaded to another replica) is
  refused, where Chainlit would send it without;
- `chat_settings_change` keeps only the settings the app offers, with values of their kind;
- the socket reads at most `Settings.socket_max_event_bytes` per event: engine.io's
  `max_http_buffer_size` (1,000,000 by default) and uvicorn's websocket frame limit (16 MiB by default,
  which Chainlit does not set) are set to it, so a larger event ends the connection unread.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import chainlit.socket  # registers Chainlit's socket handlers, which are wrapped here
import uvicorn
from chainlit.config import config as chainlit_config
from chainlit.context import context, init_ws_context
from chainlit.message import ErrorMessage
from chainlit.server import sio
from chainlit.session import WebsocketSession

from services.admission.refusals import Refused
from services.runtime import Runtime
from services.web.chat_feedback import session_user_key
from services.web.client_messages import (
    MALFORMED,
    MessageRefused,
    SocketRules,
    edited_message,
    kept_settings,
    page_message,
)
from services.web.unsent_uploads import GONE
from services.web.upload_bounds import ChainlitUploads

logger = logging.getLogger(__name__)

Handler = Callable[..., Awaitable[Any]]


class SocketGuard:
    """The checks in front of Chainlit's message handlers (one per process, installed once)."""

    def __init__(
        self,
        rules: SocketRules,
        count_message: Callable[[], Awaitable[None]],
        step_exists: Callable[[str], Awaitable[bool]],
        edit: Callable[[str, str], Awaitable[None]],
        uploads: ChainlitUploads,
    ) -> None:
        self.rules = rules
        self.uploads = uploads  # the unsent uploads a message sends
        self.count_message = count_message  # raises Refused over the sender's message rate
        self.step_exists = step_exists
        self.edit = edit  # (message id, new text): the app answers the edited message again

    async def client_message(self, handler: Handler, sid: str, payload: Any) -> Any:
        session = WebsocketSession.get(sid)
        if session is None:  # the socket went away (Chainlit's handler would raise "Session not found")
            return None
        init_ws_context(session)
        author = session.user.identifier if session.user else "User"
        try:
            await self.count_message()
            cleaned = page_message(payload, self.rules, author)
            if await self.step_exists(cleaned["message"]["id"]):
                raise MessageRefused(MALFORMED, "This message cannot be sent again (its id is taken).")
        except (Refused, MessageRefused) as refusal:
            await tell_refusal(refusal)
            return None
        if WebsocketSession.get(sid) is None:  # it went away while its id was looked up
            return None
        file_ids = [reference["id"] for reference in cleaned["fileReferences"]]
        if self.uploads.missing(session, file_ids):  # nothing below waits: Chainlit's handler starts a task
            await tell_refusal(MessageRefused(GONE, self.uploads.gone_detail()))
            return None
        handled = await handler(sid, cleaned)  # Chainlit's handler starts the message's task, and returns
        self.uploads.sent(session, file_ids, session.current_task)
        return handled

    async def edit_message(self, handler: Handler, sid: str, payload: Any) -> Any:
        """Checked, then handed to the app (`edit`) as Chainlit runs a turn: between task_start and
        task_end, in this event's task (which Stop and a disconnect cancel through the session)."""
        session = WebsocketSession.get(sid)
        if session is None:
            return None
        ws = init_ws_context(session)
        try:
            if not chainlit_config.features.edit_message:
                raise MessageRefused(MALFORMED, "Editing messages is not enabled here.")
            await self.count_message()
            edit = edited_message(payload, self.rules)
        except (Refused, MessageRefused) as refusal:
            await tell_refusal(refusal)
            return None
        await ws.emitter.task_start()
        try:
            await self.edit(edit["message"]["id"], edit["message"]["output"])
        except asyncio.CancelledError:  # Stop or a disconnect ended the turn (its answer is aborted)
            pass
        finally:
            await ws.emitter.task_end()
        return None

    async def chat_settings_change(self, handler: Handler, sid: str, values: Any) -> Any:
        kept = kept_settings(values, self.rules)
        if isinstance(values, dict) and len(kept) < len(values):
            logger.info("chat settings: dropped %d unknown or invalid value(s)", len(values) - len(kept))
        return await handler(sid, kept)


async def tell_refusal(refusal: Refused | MessageRefused) -> None:
    """An error in the sender's chat (the current socket context), neither stored nor part of its history."""
    reason = refusal.reason
    logger.info("socket message refused (%s): %s", reason, refusal)
    told = ErrorMessage(content=str(refusal))
    told.metadata = {"refused": reason}
    await context.emitter.send_step(told.to_dict())


def bound_socket_events(max_bytes: int) -> None:
    """Read at most `max_bytes` per socket.io event, on the polling and the websocket transports."""
    sio.eio.max_http_buffer_size = max_bytes
    unbounded = getattr(uvicorn.Config, "unbounded", uvicorn.Config)

    class BoundedConfig(unbounded):  # type: ignore[misc,valid-type]
        """uvicorn's Config with a websocket frame limit of `max_bytes` (Chainlit passes none)."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs.setdefault("ws_max_size", max_bytes)
            super().__init__(*args, **kwargs)

    BoundedConfig.unbounded = unbounded  # type: ignore[attr-defined]
    uvicorn.Config = BoundedConfig  # type: ignore[misc]  # chainlit.cli builds its server after the app loads


def install_socket_guard(guard: SocketGuard, max_event_bytes: int) -> None:
    """Wrap Chainlit's message handlers with `guard` (once) and bound the socket's events."""
    bound_socket_events(max_event_bytes)
    handlers = sio.handlers["/"]
    for event, check in (
        ("client_message", guard.client_message),
        ("edit_message", guard.edit_message),
        ("chat_settings_change", guard.chat_settings_change),
    ):
        chainlit_handler = handlers[event]
        if getattr(chainlit_handler, "guarded", False):
            continue

        async def wrapped(sid: str, payload: Any = None, _check=check, _handler=chainlit_handler) -> Any:
            return await _check(_handler, sid, payload)

        wrapped.guarded = True  # type: ignore[attr-defined]
        handlers[event] = wrapped
    assert chainlit.socket.message is not None, "Chainlit's client_message handler moved"


def socket_guard_for(
    runtime: Runtime,
    people_sign_in: bool,
    chat_settings: Mapping[str, type],
    edit: Callable[[str, str], Awaitable[None]],
    uploads: ChainlitUploads,
) -> SocketGuard:
    """The guard of this app: its settings, its per-person message rate (the person as admission
    keys them: `session_user_key`), its stored messages; `chat_settings` are the settings the app
    offers, `edit` answers an edited message (services/web/chat_events.py ChatEvents.edit), `uploads`
    the unsent uploads its messages send."""
    settings = runtime.settings
    rules = SocketRules(settings.max_message_chars, settings.max_files_per_message, dict(chat_settings))

    async def count_message() -> None:
        if (serving := runtime.running()) is not None:  # created at start; no socket is served before
            await serving.admission.message(session_user_key(people_sign_in))

    async def step_exists(step_id: str) -> bool:
        layer = runtime.history.layer if runtime.history is not None else None
        return layer is not None and await layer.step_exists(step_id)

    return SocketGuard(rules, count_message, step_exists, edit, uploads)
