"""A Chainlit 2.12 socket.io client: what the browser does, without the browser.

Used by the server tests, the benchmarks and the load test. Protocol notes in
../shared/FIELD_NOTES.md: the first token arrives inside `stream_start.output`,
later ones as `stream_token`; `new_message` carries the final text. While a turn
waits for its place, a status message (`metadata.status`) says where it stands;
it is deleted (`delete_message`) when the answer starts. A refused turn's reply
carries `metadata.refused` (the reason).

Each client connects with its own `X-Forwarded-For` address (the server trusts
it from loopback), so each is a different person to the per-user limits; pass
the same `address` to several clients to make them one person's tabs.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import random
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx
import socketio

from harness.waiting import WAIT_SECONDS

SOCKET_PATH = "/ws/socket.io"
COOKIE_NAME = "access_token"  # Chainlit's sign-in cookie
_addresses = itertools.count(1)


# What Chainlit 2.12's page emits on every socket connect, in order (favorites on or not).
PAGE_CONNECT_EVENTS = ("connection_successful", "fetch_favorites")


def new_address() -> str:
    """A client address of its own (10.x.y.z), for a client that should be a person of its own."""
    number = next(_addresses)
    return f"10.{(number >> 16) & 255}.{(number >> 8) & 255}.{number & 255}"


class SignInError(RuntimeError):
    """The server refused the sign-in (status and detail as the page would get them)."""

    def __init__(self, status: int, detail: str, retry_after: str | None = None) -> None:
        super().__init__(f"sign-in refused ({status}): {detail}")
        self.status = status
        self.detail = detail
        self.retry_after = retry_after


def _cookie_from(response: httpx.Response) -> str | None:
    if response.status_code != 200:
        try:
            detail = response.json().get("detail", "")
        except ValueError:
            detail = response.text
        raise SignInError(response.status_code, str(detail), response.headers.get("retry-after"))
    token = response.cookies.get(COOKIE_NAME)
    return f"{COOKIE_NAME}={token}" if token else None


def _sign_in_request(
    config: dict[str, Any], username: str | None, password: str | None
) -> dict[str, Any] | None:
    """How to sign in as the page would: the password form, or header sign-in (the local user)."""
    if not config.get("requireLogin"):
        return None
    if username is not None:
        return {"url": "/login", "data": {"username": username, "password": password or ""}}
    if config.get("headerAuth"):
        return {"url": "/auth/header", "json": {}}
    raise SignInError(401, "this server needs a username and password")


async def sign_in(base_url: str, username: str | None = None, password: str | None = None) -> str | None:
    """The Cookie header value of a signed-in session (None when the server needs no sign-in)."""
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
        request = _sign_in_request((await http.get("/auth/config")).json(), username, password)
        return None if request is None else _cookie_from(await http.post(**request))


def sign_in_sync(base_url: str, username: str | None = None, password: str | None = None) -> str | None:
    """`sign_in` for synchronous clients (the load test)."""
    with httpx.Client(base_url=base_url, timeout=30) as http:
        request = _sign_in_request(http.get("/auth/config").json(), username, password)
        return None if request is None else _cookie_from(http.post(**request))


def handshake(session_id: str, thread_id: str = "", chat_profile: str = "") -> dict[str, str]:
    """Chainlit's socket.io `auth`, as its web page sends it (`chat_profile`: the model menu's choice)."""
    return {
        "sessionId": session_id,
        "clientType": "webapp",
        "threadId": thread_id,
        "userEnv": "{}",
        "chatProfile": chat_profile,
    }


def client_headers(address: str, cookie: str | None) -> dict[str, str]:
    """The client's address (for per-address limits) and its sign-in cookie, if any."""
    return {"X-Forwarded-For": address, **({"Cookie": cookie} if cookie else {})}


_LOCAL_COOKIES: dict[str, str | None] = {}  # one sign-in per server (the local user), shared by all


def local_cookie(base_url: str) -> str | None:
    """The local user's sign-in cookie for the server at `base_url` (signed in once per process)."""
    if base_url not in _LOCAL_COOKIES:
        _LOCAL_COOKIES[base_url] = sign_in_sync(base_url)
    return _LOCAL_COOKIES[base_url]


def reconnect_delay_seconds(failures: int, rng: random.Random) -> float:
    """How long a browser's socket.io client waits before its next try after `failures` failed
    connects in a row: 1 s doubling up to 5 s, each randomized by ±50% (socket.io-client's
    reconnectionDelay, reconnectionDelayMax and randomizationFactor defaults)."""
    if failures <= 0:
        return 0.0
    return min(5.0, 2.0 ** (failures - 1)) * rng.uniform(0.5, 1.5)


def connect_sync(
    sio: Any, base_url: str, session_id: str, address: str, timeout: float = 10.0, cookie: str | None = None
) -> None:
    """Open a sync socket.io client's chat session (load generators' threads) with `cookie` (a
    signed-in browser's Cookie header), else as the local user."""
    cookie = cookie if cookie is not None else local_cookie(base_url)
    sio.connect(
        base_url,
        socketio_path=SOCKET_PATH,
        transports=["websocket"],
        auth=handshake(session_id),
        headers=client_headers(address, cookie),
        wait_timeout=timeout,
    )
    for name in PAGE_CONNECT_EVENTS:
        sio.emit(name)


def user_message_payload(
    text: str, file_ids: list[str] | None = None, command: str | None = None
) -> dict[str, Any]:
    """The `client_message` payload the page sends for a user message (Chainlit 2.12); `command`: the
    id of a command picked from the page's `/` menu, `text` then what was typed after it."""
    message = {
        "id": str(uuid.uuid4()),
        "type": "user_message",
        "output": text,
        "createdAt": datetime.now(UTC).isoformat(),
        "name": "User",
        "threadId": "",
        "metadata": {},
    }
    if command is not None:
        message["command"] = command
    return {"message": message, "fileReferences": [{"id": file_id} for file_id in file_ids or []]}


@dataclass
class Reply:
    """One assistant message as the client saw it."""

    message_id: str | None = None
    streamed: list[str] = field(default_factory=list)
    final: str | None = None
    sent_at: float = 0.0
    first_token_at: float | None = None
    done_at: float | None = None
    refused: str | None = None  # the reason, when the service refused the turn
    status: list[tuple[float, str]] = field(default_factory=list)  # (when, text) of status updates
    status_removed_at: float | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)
    earlier: set[str] = field(default_factory=set)  # messages seen before it was asked: never this one
    # An edit's answer comes after the server shows the edited message (`update_message` of this id):
    # what comes before it belongs to the turn the edit stopped, even when it started streaming late.
    after_update_of: str | None = None

    @property
    def streamed_text(self) -> str:
        return "".join(self.streamed)

    @property
    def ttft_seconds(self) -> float | None:
        return None if self.first_token_at is None else self.first_token_at - self.sent_at


class ChatClient:
    """One chat session over socket.io (async), signed in as the page would be.

    With no username, it signs in as the local user (header sign-in) when the server asks for
    sign-in; pass `cookie` to act as an already signed-in browser (a reload, another tab).
    """

    def __init__(
        self,
        base_url: str,
        username: str | None = None,
        password: str | None = None,
        cookie: str | None = None,
        session_id: str | None = None,
        address: str | None = None,
        chat_profile: str = "",
    ) -> None:
        self.base_url = base_url
        self.chat_profile = chat_profile  # the chat profile the page asks for (the model menu)
        self.address = address or new_address()  # X-Forwarded-For: the person to per-user limits
        self.username = username
        self.password = password
        self.cookie = cookie
        self.session_id = session_id or str(uuid.uuid4())  # the same id again = the same page reconnecting
        self.settings_widgets: list[dict[str, Any]] = []  # the chat settings the server offered last
        self.sio = socketio.AsyncClient(reconnection=False)
        self.events: list[tuple[str, Any]] = []
        self.messages: dict[str, dict] = {}
        self.thread_id: str | None = None  # the conversation, once the first message made it
        self.resumed: dict[str, Any] | None = None  # the stored conversation the server sent back
        self.resume_error: str | None = None
        self.resume_done = asyncio.Event()
        self._reply: Reply | None = None
        self._status_ids: set[str] = set()  # ids of status messages of the current turn
        self.sent: list[dict[str, Any]] = []  # the user messages this client sent (newest last), as sent
        self.actions: dict[str, dict[str, Any]] = {}  # the action buttons the server shows now, by id
        self.commands: list[dict[str, Any]] | None = None  # the page's `/` menu, once the server sent it
        for name in (
            "stream_start",
            "stream_token",
            "new_message",
            "update_message",
            "delete_message",
            "task_end",
            "task_start",
            "first_interaction",
            "resume_thread",
            "resume_thread_error",
            "chat_settings",
            "action",
            "remove_action",
            "set_commands",
        ):
            self.sio.on(name, self._handler(name))

    def _handler(self, name: str):
        async def handle(data: Any = None) -> None:
            self.events.append((name, data))
            del self.events[:-200]  # keep the tail only: long runs must not grow
            self._on_event(name, data)

        return handle

    def _on_event(self, name: str, data: Any) -> None:
        if name == "chat_settings" and isinstance(data, list):
            self.settings_widgets = data
        if name == "set_commands" and isinstance(data, list):
            self.commands = data
        if name in ("action", "remove_action") and isinstance(data, dict):
            self.actions.pop(data.get("id"), None)
            if name == "action":
                self.actions[data["id"]] = data
        if name == "first_interaction" and isinstance(data, dict):
            self.thread_id = data.get("thread_id")
        elif name in ("resume_thread", "resume_thread_error"):
            self.resumed = data if name == "resume_thread" else None
            self.resume_error = data if name == "resume_thread_error" else None
            self.resume_done.set()
        reply = self._reply
        if name in ("new_message", "update_message", "stream_start") and isinstance(data, dict):
            self.messages[data["id"]] = data
        if reply is not None and reply.after_update_of is not None:  # the edit not shown yet
            if name == "update_message" and self.messages.get(reply.after_update_of) is data:
                reply.after_update_of = None
            return
        if (
            reply is None
            or reply.done.is_set()
            or (isinstance(data, dict) and data.get("id") in reply.earlier)
        ):
            return
        now = time.monotonic()
        if self._on_status(reply, name, data, now):
            return
        if name == "stream_start" and data.get("type") == "assistant_message":
            reply.message_id = data["id"]
            reply.first_token_at = now
            reply.streamed.append(data.get("output") or "")
        elif name == "stream_token" and data.get("id") == reply.message_id:
            reply.streamed.append(data["token"])
        elif name in ("new_message", "update_message") and data.get("type") == "assistant_message":
            if reply.message_id is None and data.get("name") != "notice":
                reply.message_id = data["id"]  # answered without streaming (e.g. an error)
            if data["id"] == reply.message_id:
                reply.final = data.get("output", "")
                reply.refused = (data.get("metadata") or {}).get("refused")
                reply.done_at = now
                reply.done.set()

    def _on_status(self, reply: Reply, name: str, data: Any, now: float) -> bool:
        """Record the turn's status messages (place in line); True when `data` was one."""
        if not isinstance(data, dict):
            return False
        if name == "delete_message" and data.get("id") in self._status_ids:
            reply.status_removed_at = now
            return True
        if name in ("new_message", "update_message") and (data.get("metadata") or {}).get("status"):
            self._status_ids.add(data["id"])
            reply.status.append((now, data.get("output") or ""))
            return True
        return False

    async def connect(self, thread_id: str = "") -> None:
        """Sign in (first time), open the socket; `thread_id` opens a stored conversation."""
        if self.cookie is None:
            self.cookie = await sign_in(self.base_url, self.username, self.password)
        await self.sio.connect(
            self.base_url,
            socketio_path=SOCKET_PATH,
            transports=["websocket"],
            auth=handshake(self.session_id, thread_id, self.chat_profile),
            wait_timeout=10,
            headers=client_headers(self.address, self.cookie),
        )
        if thread_id:
            self.thread_id = thread_id
        for name in PAGE_CONNECT_EVENTS:
            await self.sio.emit(name)

    async def conversation_id(self, timeout: float = 30) -> str:
        """The conversation's id, once the server said it (after its first write, which may come
        after the first tokens of the answer)."""
        deadline = time.monotonic() + timeout
        while not self.thread_id:
            if time.monotonic() > deadline:
                raise TimeoutError("the server never said the conversation's id")
            await asyncio.sleep(0.01)
        return self.thread_id

    async def resume(self, thread_id: str, timeout: float = 30) -> dict[str, Any]:
        """Open a stored conversation as a reloaded page does; return what the server sent back."""
        await self.connect(thread_id)
        await asyncio.wait_for(self.resume_done.wait(), timeout)
        if self.resumed is None:
            raise AssertionError(f"resume refused: {self.resume_error}")
        return self.resumed

    async def send(self, text: str, file_ids: list[str] | None = None, command: str | None = None) -> Reply:
        """Send a user message (`command`: as picked from the `/` menu); the returned Reply fills in as
        the answer streams."""
        reply = self._expect_reply()
        payload = user_message_payload(text, file_ids, command)
        self.sent.append(payload["message"])
        await self.sio.emit("client_message", payload)
        return reply

    def _expect_reply(self) -> Reply:
        self._reply = Reply(sent_at=time.monotonic(), earlier=set(self.messages))
        self._status_ids.clear()
        return self._reply

    async def edit(self, message_id: str, text: str) -> Reply:
        """Edit a sent message as the page's edit button does (the message as the page holds it, with
        the new text); the returned Reply fills in with the new answer."""
        sent = next((m for m in self.sent if m["id"] == message_id), None)
        message = {**(sent or user_message_payload("")["message"]), "id": message_id, "output": text}
        reply = self._expect_reply()
        reply.after_update_of = message_id
        await self.sio.emit("edit_message", {"message": message})
        return reply

    def regenerate_action(self) -> dict[str, Any] | None:
        """The Regenerate button the server shows now (on the last answer), if any."""
        return next((a for a in self.actions.values() if a.get("name") == "regenerate"), None)

    async def regenerate(self, action: dict[str, Any] | None = None) -> tuple[httpx.Response, Reply]:
        """Press Regenerate as the page does (POST /project/action; default: the button shown now);
        return the route's response and the Reply that fills in with the new answer."""
        action = action or self.regenerate_action()
        assert action is not None, "no Regenerate button is shown"
        reply = self._expect_reply()
        response = await self.http(
            "POST", "/project/action", json={"sessionId": self.session_id, "action": action}
        )
        return response, reply

    async def upload(self, name: str, data: bytes, mime: str = "application/octet-stream") -> str:
        """Upload a file as the page does; return its id for `send(..., file_ids=[...])`."""
        headers = {"Cookie": self.cookie} if self.cookie else {}
        async with httpx.AsyncClient(base_url=self.base_url, timeout=60, headers=headers) as http:
            response = await http.post(
                "/project/file", params={"session_id": self.session_id}, files={"file": (name, data, mime)}
            )
        response.raise_for_status()
        return response.json()["id"]

    async def ask(
        self, text: str, timeout: float = 120, file_ids: list[str] | None = None, command: str | None = None
    ) -> Reply:
        reply = await self.send(text, file_ids, command)
        await asyncio.wait_for(reply.done.wait(), timeout)
        return reply

    async def offered_commands(self, timeout: float = 30) -> list[dict[str, Any]]:
        """The commands of the page's `/` menu, once the server sent them (after the chat started)."""
        deadline = time.monotonic() + timeout
        while self.commands is None:
            if time.monotonic() > deadline:
                raise TimeoutError("the server sent no command menu")
            await asyncio.sleep(0.05)
        return self.commands

    async def wait_first_token(self, reply: Reply, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while reply.first_token_at is None:
            if reply.done.is_set():
                raise AssertionError(f"answered without streaming: {reply.final!r}")
            if time.monotonic() > deadline:
                raise TimeoutError("no token streamed")
            await asyncio.sleep(0.01)

    async def start_long_answer(self, max_new_tokens: int = 3000) -> Reply:
        """Ask for a long sampled answer and return once its first token has streamed."""
        await self.update_settings(max_new_tokens=max_new_tokens, temperature=1.0)
        reply = await self.send("Tell me everything you know.")
        await self.wait_first_token(reply)
        return reply

    async def stop(self) -> None:
        await self.sio.emit("stop")

    def notices(self) -> list[str]:
        """The texts of the notices the app sent (recent events only)."""
        return [
            data.get("output", "")
            for name, data in self.events
            if name == "new_message" and isinstance(data, dict) and data.get("name") == "notice"
        ]

    async def http(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """An HTTP request to the app as this signed-in browser (REST routes of the sidebar, feedback)."""
        headers = {"Cookie": self.cookie} if self.cookie else {}
        async with httpx.AsyncClient(base_url=self.base_url, timeout=30, headers=headers) as http:
            return await http.request(method, path, **kwargs)

    async def update_settings(self, **values: Any) -> None:
        await self.sio.emit("chat_settings_change", values)

    async def close(self) -> None:
        """End the conversation as the page's "New chat" does, so the server frees it at once.

        The page emits clear_session and disconnects straight away, and the server may handle the
        disconnect first (then it keeps the conversation for session_timeout); waiting for the
        event's acknowledgement makes the ending deterministic (as long as the wait is not cut
        short: a busy server acknowledges late, hence a bound far past what it takes).
        """
        with contextlib.suppress(Exception):
            await self.sio.call("clear_session", timeout=WAIT_SECONDS)
        await self.sio.disconnect()

    async def leave(self) -> None:
        """Close the socket without ending the conversation (a closed tab): it stays for a reconnect."""
        await self.sio.disconnect()

    async def drop(self) -> None:
        """Vanish abruptly: kill the TCP connection, no socket.io or websocket goodbye."""
        engine_io = self.sio.eio
        connection = engine_io.ws._response.connection if engine_io.ws is not None else None
        if connection is not None and connection.transport is not None:
            connection.transport.abort()
        with contextlib.suppress(Exception):
            await engine_io.disconnect(abort=True)


def describe(events: list[tuple[str, Any]]) -> str:
    return "\n".join(f"{name}: {json.dumps(data)[:200]}" for name, data in events)
