"""Hostile socket.io traffic, drawn by Hypothesis, against the real server: handshakes of any shape
from Alice and from nobody, then any sequence of events with payloads of any type and size.

After every example: the server answers, its log has no traceback or error line, nothing outside
its folders changed, Bob's conversation is as it was, and the connection was either refused
cleanly or still works (it acknowledges an event and then serves a chat turn).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import socketio
from hypothesis import example, given
from hypothesis import strategies as st

from harness.chat_client import (
    SOCKET_PATH,
    ChatClient,
    client_headers,
    handshake,
    new_address,
    user_message_payload,
)
from harness.server import AppServer
from harness.waiting import WAIT_SECONDS
from services.config import Settings
from services.history.resume import chat_settings_of
from services.web.client_ids import handshake_problem
from tests.system.security.conftest import Intact
from tests.system.security.fuzzing import (
    NESTING_DEPTHS,
    Deep,
    Victims,
    fuzz_settings,
    hostile_id,
    hostile_text,
    hostile_value,
    render,
    sometimes,
)

PAGE_AUTH = {"sessionId": "{new_uuid}", "clientType": "webapp", "threadId": "", "userEnv": "{}",
             "chatProfile": ""}  # fmt: skip
one_field_changed = st.tuples(st.sampled_from([*PAGE_AUTH, "extra"]), hostile_id).map(
    lambda change: {**PAGE_AUTH, change[0]: change[1]}
)
free_form = st.fixed_dictionaries(
    {}, optional={key: sometimes(value, hostile_id) for key, value in PAGE_AUTH.items()}
)
handshakes = st.one_of(one_field_changed, free_form, hostile_value.filter(lambda v: not isinstance(v, dict)))

NO_PAYLOAD = object()  # the event is sent without data
CHAT_SETTINGS = ("temperature", "top_p", "max_new_tokens", "system_prompt")


def messages() -> st.SearchStrategy:
    """`client_message` / `edit_message` payloads: the page's, with any field hostile or missing."""
    page = user_message_payload("Hi.")["message"]
    fields = {**page, "id": "{new_uuid}", "parentId": None, "command": None, "language": None}
    message = st.fixed_dictionaries(
        {"id": sometimes("{new_uuid}", hostile_id), "output": sometimes("Hi.", hostile_text)},
        optional={key: sometimes(value) for key, value in fields.items() if key not in ("id", "output")},
    )
    references = st.lists(st.fixed_dictionaries({"id": hostile_id}), max_size=3)
    return st.one_of(
        st.fixed_dictionaries({"message": message}, optional={"fileReferences": sometimes([], references)}),
        st.fixed_dictionaries({"message": hostile_value}),
    )


chat_settings = st.dictionaries(
    st.one_of(st.sampled_from(CHAT_SETTINGS), hostile_text),
    st.one_of(st.floats(allow_nan=True), st.integers(min_value=-(2**70), max_value=2**70), hostile_value),
    max_size=5,
)
audio_chunk = st.fixed_dictionaries(
    {
        "isStart": sometimes(True),
        "mimeType": sometimes("pcm16"),
        "elapsedTime": sometimes(0.5),
        "data": sometimes(b"\x00\x01" * 8, st.binary(max_size=64)),
    }
)
PAYLOADS: dict[str, st.SearchStrategy] = {
    "client_message": messages(),
    "edit_message": messages(),
    "chat_settings_change": chat_settings,
    "chat_settings_edit": chat_settings,
    "audio_chunk": audio_chunk,
    "message_favorite": messages(),
}
EVENTS = (
    *PAYLOADS, "stop", "clear_session", "window_message", "audio_start", "audio_end", "fetch_favorites",
    "connection_successful", "connect", "disconnect",
)  # fmt: skip


def payload_for(name: str) -> st.SearchStrategy:
    page_like = PAYLOADS.get(name, st.nothing())
    deep = st.sampled_from(NESTING_DEPTHS).map(Deep)
    several = st.lists(hostile_value, min_size=2, max_size=3).map(tuple)  # more than one argument
    return st.one_of(page_like, st.just(NO_PAYLOAD), hostile_value, deep, several)


@dataclass(frozen=True)
class Raw:
    """A packet sent as this text, whatever socket.io's framing says."""

    text: str


RAW_PACKETS = (
    "2", "2[", "2[]", "2{}", "2[null]", "2[1,2]", '2["connect",{"HTTP_COOKIE":""},{}]', '2["disconnect"]',
    "3", "4", "0", "1", '0{"sid":"x"}', '2/other,["x"]',
    '51-["client_message",{"_placeholder":true,"num":0}]',
    "0" + json.dumps(handshake(str(uuid.UUID(int=7, version=4)))),  # a second connect
    '2["client_message",' + "[" * 100_000, "2" + "\\ud800", '2["client_message","\\ud800"]',
)  # fmt: skip
raw_packets = st.one_of(st.sampled_from(RAW_PACKETS), st.text(max_size=200)).map(Raw)
event_names = st.one_of(st.sampled_from(EVENTS), st.text(min_size=1, max_size=30))
one_event = st.one_of(
    event_names.flatmap(lambda name: st.tuples(st.just(name), payload_for(name))),
    st.tuples(st.just("raw"), raw_packets),
)
events = st.lists(one_event, min_size=1, max_size=4)


@dataclass
class Outcome:
    accepted: bool
    works: bool | None = None  # None: refused, so not tried


async def open_socket(server: AppServer, auth: Any, cookie: str | None) -> socketio.AsyncClient | None:
    """A socket with `auth` as its handshake; None when the server refused it."""
    sio = socketio.AsyncClient(reconnection=False)
    try:
        await sio.connect(server.base_url, socketio_path=SOCKET_PATH, transports=["websocket"], auth=auth,
                          headers=client_headers(new_address(), cookie), wait_timeout=10)  # fmt: skip
    except socketio.exceptions.ConnectionError:
        return None
    return sio


async def still_works(sio: socketio.AsyncClient, answers: bool = False, timeout: float = 20) -> bool:
    """The server still handles this socket's session: it acknowledges an event (which needs the
    session) and, if `answers`, answers a message."""
    answered = asyncio.Event()
    sio.on("new_message", lambda data: answered.set() if data.get("type") == "assistant_message" else None)
    try:
        await sio.call("window_message", "ping", timeout=15)
        if answers:
            await sio.emit("client_message", user_message_payload("Still there?"))
            await asyncio.wait_for(answered.wait(), timeout)
    except (TimeoutError, socketio.exceptions.SocketIOError):
        return False
    return True


async def handshake_attack(server: AppServer, auth: Any, cookie: str | None) -> Outcome:
    sio = await open_socket(server, auth, cookie)
    if sio is None:
        return Outcome(accepted=False)
    try:
        await sio.emit("connection_successful")
        return Outcome(accepted=True, works=await still_works(sio, answers=True))
    finally:
        await close(sio)


async def close(sio: socketio.AsyncClient) -> None:
    with contextlib.suppress(Exception):
        await sio.call("clear_session", timeout=5)
    with contextlib.suppress(Exception):
        await sio.disconnect()


async def event_attack(server: AppServer, cookie: str, sequence: list[tuple[str, Any]]) -> bool:
    """Send `sequence` on a signed-in socket; True when the socket still works afterwards."""
    client = ChatClient(server.base_url, cookie=cookie)
    await client.connect()
    try:
        for name, payload in sequence:
            with contextlib.suppress(socketio.exceptions.SocketIOError):
                await send(client.sio, name, payload)
        await asyncio.sleep(0.2)  # the server handles each event in a task of its own
        return await still_works(client.sio)
    finally:
        await close(client.sio)


async def send(sio: socketio.AsyncClient, name: str, payload: Any) -> None:
    """Emit `name` with `payload` as socket.io would, or as raw text for what its encoder refuses."""
    if payload is NO_PAYLOAD:
        await sio.emit(name)
    elif isinstance(payload, Deep):
        await sio.eio.send("2" + json.dumps([name])[:-1] + "," + payload.text + "]")
    elif isinstance(payload, Raw):
        await sio.eio.send(payload.text)
    else:
        await sio.emit(name, payload)


def settle(server: AppServer, timeout: float = WAIT_SECONDS) -> None:
    """Wait until no chat turn runs (tracebacks of a turn land in the log by then)."""
    deadline = time.monotonic() + timeout
    while server.status().get("turns_in_flight", 0) and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.2)


@fuzz_settings()
@given(auth=handshakes, signed_in=st.booleans())
@example(auth={**PAGE_AUTH, "threadId": "{bob_thread}"}, signed_in=True)
@example(auth={**PAGE_AUTH, "userEnv": "not json"}, signed_in=True)
@example(auth={**PAGE_AUTH, "userEnv": "[1]"}, signed_in=True)
@example(auth=PAGE_AUTH, signed_in=True)
@example(auth=PAGE_AUTH, signed_in=False)
def test_any_handshake_is_refused_cleanly_or_works(
    target: AppServer, alice_cookie: str, victims: Victims, intact: Intact, auth: Any, signed_in: bool
) -> None:
    auth = render(auth, victims)
    mark = intact.mark()
    outcome = asyncio.run(handshake_attack(target, auth, alice_cookie if signed_in else None))
    settle(target)
    shown = repr(auth)[:300]
    names_bobs_thread = isinstance(auth, dict) and auth.get("threadId") == victims.bob_thread
    if not signed_in or handshake_problem(auth) is not None or names_bobs_thread:
        assert not outcome.accepted, f"accepted: {shown}"
    assert outcome.works is not False, f"accepted but then unusable: {shown}"
    assert not intact.problems(mark), (shown, intact.problems(mark))


@fuzz_settings()
@given(sequence=events)
@example(sequence=[("client_message", {"message": {**user_message_payload("Mine now.")["message"],
                                                    "id": "{bob_step}"}})])  # fmt: skip
@example(sequence=[("client_message", "x"), ("edit_message", {}), ("stop", "x"), ("clear_session", [1])])
@example(
    sequence=[
        ("connect", ({"HTTP_COOKIE": "{alice_cookie}", "REMOTE_ADDR": "192.0.2.1"}, PAGE_AUTH)),
        ("connect", ({"HTTP_COOKIE": "{alice_cookie}"}, PAGE_AUTH)),
        ("disconnect", NO_PAYLOAD),
    ]
)
@example(sequence=[("raw", Raw("0" + json.dumps(handshake(str(uuid.UUID(int=8, version=4))))))])
@example(
    sequence=[("chat_settings_change", None), ("chat_settings_change", [1, 2]), ("connection_successful", 1)]
)
@example(sequence=[("chat_settings_change", {"system_prompt": "\ud800", "temperature": float("nan")})])
@example(sequence=[("client_message", {"message": {**user_message_payload("Hi \ud800")["message"]}})])
@example(sequence=[("client_message", Deep(50_000)), ("window_message", {"a": "\x00"})])
def test_any_event_leaves_the_server_bob_and_the_disk_intact(
    target: AppServer,
    new_person: Callable[[], str],
    victims: Victims,
    intact: Intact,
    sequence: list[tuple[str, Any]],
) -> None:
    sequence = render(sequence, victims)
    attacker = new_person()
    mark = intact.mark()
    works = asyncio.run(event_attack(target, attacker, sequence))
    settle(target)
    shown = repr(sequence)[:400]
    # A raw packet may end the socket (a close, a namespace disconnect): then only the server's side
    # is checked, and the session may be kept for the page to reconnect (session_timeout).
    raw = [payload for _, payload in sequence if isinstance(payload, Raw)]
    assert works or raw, f"unusable after {shown}"
    left = any(packet.text.startswith("1") for packet in raw)
    assert not intact.problems(mark, sessions=not left), (shown, intact.problems(mark, sessions=not left))


async def settings_attack(server: AppServer, cookie: str, changes: list[Any]) -> dict[str, Any]:
    """Start a conversation, send `changes` as chat settings, end it; the chat settings stored with it."""
    client = ChatClient(server.base_url, cookie=cookie)
    await client.connect()
    try:
        assert (await client.ask("Hi.")).final is not None
        for change in changes:
            await client.sio.emit("chat_settings_change", change)
        await client.sio.call("window_message", "ping", timeout=15)  # handled after the changes
    finally:
        await client.close()  # Chainlit stores the session's chat settings with the conversation
    deadline = time.monotonic() + WAIT_SECONDS  # as it handles the disconnect
    while time.monotonic() < deadline:
        thread = (await client.http("GET", f"/project/thread/{client.thread_id}")).json()
        if stored := chat_settings_of(thread):
            return stored
        await asyncio.sleep(0.1)
    return {}


def settings_problems(stored: dict[str, Any]) -> list[str]:
    """What in `stored` is not a setting in effect: unknown keys, values out of range or type."""
    limits = Settings.from_env({})
    expected = {
        "temperature": lambda v: isinstance(v, float) and 0 <= v <= 2,
        "top_p": lambda v: isinstance(v, float) and 0 < v <= 1,
        # Chainlit keeps a slider's value as a float (8.0) until the person moves it.
        "max_new_tokens": lambda v: (
            type(v) in (int, float) and v in range(1, limits.max_new_tokens_limit + 1)
        ),
        "system_prompt": lambda v: isinstance(v, str) and len(v) <= limits.max_message_chars,
        "save_as_default": lambda v: isinstance(v, bool),  # the presets' switch (services/presets)
    }
    return [
        f"{key}={str(value)[:80]!r}" for key, value in stored.items() if not expected.get(key, bool)(value)
    ] + [f"unknown key {key[:80]!r}" for key in stored if key not in expected]


@fuzz_settings()
@given(changes=st.lists(st.one_of(chat_settings, hostile_value), min_size=1, max_size=3))
@example(changes=[{"temperature": "1e400", "top_p": [1], "max_new_tokens": 10**30,
                   "system_prompt": "x" * 200_000, "junk": {"nested": ["garbage"]}}])  # fmt: skip
def test_chat_settings_of_any_shape_are_stored_as_in_effect(
    target: AppServer, new_person: Callable[[], str], victims: Victims, intact: Intact, changes: list[Any]
) -> None:
    changes = render(changes, victims)
    attacker = new_person()
    mark = intact.mark()
    stored = asyncio.run(settings_attack(target, attacker, changes))
    settle(target)
    shown = repr(changes)[:400]
    assert stored, f"no chat settings stored after {shown}"
    assert not settings_problems(stored), (shown, settings_problems(stored))
    assert not intact.problems(mark), (shown, intact.problems(mark))
