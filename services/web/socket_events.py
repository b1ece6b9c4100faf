"""Socket events checked at our edge: an event that is not what Chainlit's page sends is dropped, with
one warning line, before Chainlit sees it.

Chainlit 2.12's socket handlers trust the page (SECURITY.md, known upstream issues):
- they index payloads unchecked (`payload["message"]["id"]`, `settings.items()`) and take no data
  where the page sends none, so any other shape raised inside the handler: a traceback in the log
  per event, and for `client_message` the exception's text sent back to the client;
- python-socketio dispatches a client's event named `connect` or `disconnect` to the handlers of
  the real connect and disconnect: each `connect` event made one more Chainlit session (with an
  environ the client wrote) that nothing ever freed, and `disconnect` ended the chat of a socket
  that stayed open; a second CONNECT packet on a connected socket did the same;
- python-socketio logs a traceback for every frame it cannot decode (not JSON, nested past
  Python's recursion limit, a packet type only servers send): such frames are dropped here;
- `edit_message`, the favorites events and the audio events run whatever the feature switches of
  .chainlit/config.toml say (the page only hides them): here they are dropped while switched off.
  The page asks `fetch_favorites` on every connect, switched on or not, and Chainlit's handler then
  answers nothing: so does this edge, without a warning (`ASKED_WHATEVER_THE_SWITCH`);
- a lone surrogate in a text (JSON's `"\\ud800"`) failed the turn in the tokenizer, with a traceback,
  and every database write of it: such characters become U+FFFD here.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from typing import Any

from chainlit.config import config as chainlit_config
from chainlit.server import sio
from socketio import packet

from services.history.data_layer import is_uuid

logger = logging.getLogger(__name__)

Check = Callable[[tuple[Any, ...]], str | None]


def _no_data(args: tuple[Any, ...]) -> str | None:
    return "takes no data" if args else None


def _one_object(args: tuple[Any, ...]) -> str | None:
    return None if len(args) == 1 and isinstance(args[0], dict) else "takes one JSON object"


def _one_value(args: tuple[Any, ...]) -> str | None:
    return None if len(args) == 1 else "takes one value"


MAX_EVENT_DEPTH = 16  # levels of lists and objects in an event's data; the page's go 4 deep
# What decoding a client's frame raises when the frame is not socket.io (python-socketio's Packet).
MALFORMED = (ValueError, TypeError, IndexError, KeyError, RecursionError)
CLIENT_PACKET_TYPES = (
    packet.CONNECT,
    packet.DISCONNECT,
    packet.EVENT,
    packet.ACK,
    packet.BINARY_EVENT,
    packet.BINARY_ACK,
)
OPTIONAL_TEXT_FIELDS = ("name", "threadId", "parentId", "command", "language")


def message_problem(message: Any) -> str | None:
    """Why a message the page sent is refused: Chainlit makes a stored step of it as it is."""
    if not isinstance(message, dict):
        return "the message is not an object"
    if not is_uuid(message.get("id")) or uuid.UUID(message["id"]).version != 4:
        return "the message id must be a version 4 UUID"
    if message.get("type") != "user_message":
        return "the message is not a user message"
    if not isinstance(message.get("output"), str) or not isinstance(message.get("createdAt"), str):
        return "the message has no text or no time"
    if any(not isinstance(message.get(key), str | None) for key in OPTIONAL_TEXT_FIELDS):
        return "a message field that should be text is not"
    if any(not isinstance(message.get(key), dict | None) for key in ("metadata", "modes")):
        return "the message's metadata or modes are not objects"
    return None


def _message_payload(args: tuple[Any, ...]) -> str | None:
    if problem := _one_object(args):
        return problem
    payload = args[0]
    if problem := message_problem(payload.get("message")):
        return problem
    references = payload.get("fileReferences")
    if references is not None and (
        not isinstance(references, list)
        or any(not isinstance(ref, dict) or not isinstance(ref.get("id"), str) for ref in references)
    ):
        return "the file references are not a list of ids"
    return None


def _settings(args: tuple[Any, ...]) -> str | None:
    if problem := _one_object(args):
        return problem
    return None if all(isinstance(key, str) for key in args[0]) else "a setting's name is not text"


def _edit_enabled() -> bool:
    return bool(chainlit_config.features.edit_message)


def _favorites_enabled() -> bool:
    return bool(chainlit_config.features.favorites)


def _audio_enabled() -> bool:
    audio = chainlit_config.features.audio
    return bool(audio and audio.enabled)


def _always() -> bool:
    return True


# Event -> (the shape of its data, whether the feature is switched on).
EVENT_RULES: dict[str, tuple[Check, Callable[[], bool]]] = {
    "connection_successful": (_no_data, _always),
    "clear_session": (_no_data, _always),
    "stop": (_no_data, _always),
    "client_message": (_message_payload, _always),
    "edit_message": (_message_payload, _edit_enabled),
    "chat_settings_change": (_settings, _always),
    "chat_settings_edit": (_settings, _always),
    "window_message": (_one_value, _always),
    "message_favorite": (_message_payload, _favorites_enabled),
    "fetch_favorites": (_no_data, _favorites_enabled),
    "audio_start": (_no_data, _audio_enabled),
    "audio_chunk": (_one_object, _audio_enabled),
    "audio_end": (_no_data, _audio_enabled),
}


# Events Chainlit's page sends whether their feature is on or not: switched off, one is not a client's
# mistake, and is dropped as Chainlit's own handler would ignore it, without a word in the log.
ASKED_WHATEVER_THE_SWITCH = frozenset({"fetch_favorites"})
SWITCHED_OFF = "switched off in .chainlit/config.toml"


def depth_of(value: Any, limit: int) -> int:
    """How deeply `value` nests lists and objects (counted without recursion), up to `limit` + 1."""
    deepest = 0
    stack = [(value, 1)]
    while stack and deepest <= limit:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        stack.extend((child, depth + 1) for child in children)
    return deepest


def event_problem(name: Any, args: tuple[Any, ...]) -> str | None:
    """Why a client's event is dropped; None when Chainlit may handle it."""
    if not isinstance(name, str) or name in sio.reserved_events or name == "connect_error":
        return "reserved or malformed event name"
    if depth_of(list(args), MAX_EVENT_DEPTH) > MAX_EVENT_DEPTH:
        return "nested too deeply"
    rule = EVENT_RULES.get(name)
    if rule is None:
        return None  # no handler: python-socketio ignores it
    shape, enabled = rule
    if not enabled():
        return SWITCHED_OFF
    return shape(args)


def asked_while_off(name: Any, args: tuple[Any, ...]) -> bool:
    """An event the page sends on its own while its feature is off (`ASKED_WHATEVER_THE_SWITCH`), of
    the page's shape: Chainlit would answer nothing, and nothing is wrong."""
    if name not in ASKED_WHATEVER_THE_SWITCH or event_problem(name, args) != SWITCHED_OFF:
        return False
    shape, _ = EVENT_RULES[name]
    return shape(args) is None


def valid_unicode(value: Any) -> Any:
    """`value` with every lone surrogate in its strings (keys too) replaced by U+FFFD: JSON may
    carry them (`"\\ud800"`), but neither the tokenizer nor the database takes them."""
    if isinstance(value, str):
        if value.isascii():
            return value
        return value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    if isinstance(value, list):
        return [valid_unicode(item) for item in value]
    if isinstance(value, dict):
        return {valid_unicode(key): valid_unicode(item) for key, item in value.items()}
    return value


def frame_problem(eio_sid: str, frame: Any) -> str | None:
    """Why a client's frame (one Engine.IO message) is not a socket.io packet a client may send."""
    if eio_sid in sio._binary_packet:
        return None  # an attachment (handle_frame drops a pending packet when text comes instead)
    try:
        decoded = sio.packet_class(encoded_packet=frame)
    except MALFORMED as error:
        return f"not a socket.io packet ({type(error).__name__})"
    namespace = decoded.namespace or "/"
    connected = sio.manager.sid_from_eio_sid(eio_sid, namespace) is not None
    if decoded.packet_type not in CLIENT_PACKET_TYPES:
        return "a packet type clients do not send"
    if decoded.packet_type == packet.CONNECT and connected:
        return "a second connect on a connected socket"
    if decoded.packet_type in (packet.BINARY_EVENT, packet.BINARY_ACK) and not connected:
        return "binary data before connecting"
    return None


def guard_socket_events() -> None:
    """Drop the frames `frame_problem` refuses and the events `event_problem` refuses, before
    python-socketio decodes or dispatches them (once)."""
    dispatch = sio._handle_event
    receive = sio._handle_eio_message
    if getattr(dispatch, "checks_events", False):
        return

    async def handle_frame(eio_sid: str, frame: Any) -> None:
        if eio_sid in sio._binary_packet and not isinstance(frame, bytes):
            sio._binary_packet.pop(eio_sid)  # python-socketio would wait for these forever
            logger.warning("socket packet dropped: its binary attachments never came")
        if problem := frame_problem(eio_sid, frame):
            logger.warning("socket frame dropped: %s", problem)
            return
        attachment = eio_sid in sio._binary_packet
        try:
            await receive(eio_sid, frame)
        except MALFORMED as error:
            if not attachment:  # then the error is not the frame's: the connect handler runs inline
                raise
            sio._binary_packet.pop(eio_sid, None)  # events themselves run in tasks of their own
            logger.warning("socket attachment dropped: %s", type(error).__name__)

    async def handle_event(eio_sid: str, namespace: str | None, ack_id: int | None, data: Any) -> None:
        name, args = (data[0], tuple(data[1:])) if isinstance(data, list) and data else (None, ())
        if problem := event_problem(name, args):
            if not asked_while_off(name, args):
                logger.warning("socket event %.40r dropped: %s", name, problem)
            return
        await dispatch(eio_sid, namespace, ack_id, valid_unicode(data))

    handle_event.checks_events = True  # type: ignore[attr-defined]
    sio._handle_event = handle_event  # type: ignore[method-assign]
    sio.eio.on("message", handle_frame)  # Engine.IO holds the handler it was given at start
