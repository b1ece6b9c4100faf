"""Locust load test over Chainlit's socket.io protocol: one chat session per user at a time.

Against a running app (single Locust process; the knobs below are flags or env vars):
    .venv/bin/locust -f locustfile.py --headless -u 50 -r 10 -t 5m --host http://127.0.0.1:8000

Each user opens a chat session, sets its answer budget (`chat_settings_change`),
sends 1..TURNS_PER_SESSION messages (short questions, or long documents with
an instruction, from bench/data/prompts.json) with think time 0.1-0.5 s, then
ends the session and opens a new one. Each user is a person of their own to the app's per-person
limits (its own X-Forwarded-For address, trusted from loopback; all sign in as the local user,
whose share is counted per address). Users picked by --vanish-fraction end
each session instead by vanishing mid-stream: the TCP connection is shut
without a websocket close frame or socket.io disconnect packet, as when a
browser tab is killed, so the server's cleanup path is exercised.

Locust request events (type / name):
    socketio / connect               connect + namespace handshake (after a failed one, the
                                     user waits as a browser does: 1 s doubling to 5 s, ±50%)
    chat / ttft short|long           send -> first streamed token
    chat / total short|long          send -> final message (complete turns only)
    chat / vanish                    send -> abrupt close (a deliberate drop, not a failure)
    chat / refused                   send -> "busy, please try again in ~N" (the service's answer
                                     to overload, not a failure); the user waits N, as a person
                                     would, and goes on in the same session
--requests-csv FILE appends one row per event (for bench/memory/soak.py's percentiles and plots).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import random
import re
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import socketio
from locust import User, between, events, task

from harness.chat_client import connect_sync, reconnect_delay_seconds, user_message_payload
from harness.csv_log import CsvLog

PROMPTS_FILE = Path(__file__).resolve().parent / "bench" / "data" / "prompts.json"
ERROR_MARK = "⚠️"  # app.py prefixes every failed turn's message with it
RETRY_HINT = re.compile(r"try again in ~(\d+) (s|min|h)\b")  # services/admission/refusals.py
MAX_RETRY_WAIT_S = 120.0  # a person gives up waiting on the hint after this
REQUESTS_CSV_HEADER = (
    "unix_time",
    "request_type",
    "name",
    "response_time_ms",
    "response_length",
    "ok",
    "error",
)


# --- options ---------------------------------------------------------------------
@events.init_command_line_parser.add_listener
def add_options(parser: Any) -> None:
    group = parser.add_argument_group("chat load")
    group.add_argument(
        "--max-new-tokens",
        type=int,
        default=64,
        env_var="LOCUST_MAX_NEW_TOKENS",
        help="Answer budget each session sets in its chat settings.",
    )
    group.add_argument(
        "--vanish-fraction",
        type=float,
        default=0.2,
        env_var="LOCUST_VANISH_FRACTION",
        help="Share of users whose sessions end by vanishing mid-stream.",
    )
    group.add_argument(
        "--long-fraction",
        type=float,
        default=0.2,
        env_var="LOCUST_LONG_FRACTION",
        help="Share of messages that are long documents.",
    )
    group.add_argument(
        "--turns-per-session",
        type=int,
        default=3,
        env_var="LOCUST_TURNS_PER_SESSION",
        help="A session sends 1..N messages, then ends.",
    )
    group.add_argument(
        "--turn-timeout",
        type=float,
        default=300.0,
        env_var="LOCUST_TURN_TIMEOUT",
        help="Seconds a turn may take before it counts as failed.",
    )
    group.add_argument(
        "--temperature",
        type=float,
        default=-1.0,
        env_var="LOCUST_TEMPERATURE",
        help="Sampling temperature to set (negative: keep the server's default).",
    )
    group.add_argument(
        "--prompts-file",
        default=str(PROMPTS_FILE),
        env_var="LOCUST_PROMPTS_FILE",
        help="JSON with 'short' questions and 'long' documents.",
    )
    group.add_argument(
        "--requests-csv",
        default="",
        env_var="LOCUST_REQUESTS_CSV",
        help="Append one CSV row per request event to this file.",
    )


@dataclass(frozen=True)
class Knobs:
    """The load's settings, from Locust's parsed options (or their defaults)."""

    max_new_tokens: int = 64
    vanish_fraction: float = 0.2
    long_fraction: float = 0.2
    turns_per_session: int = 3
    turn_timeout: float = 300.0
    temperature: float = -1.0
    prompts_file: str = str(PROMPTS_FILE)

    @classmethod
    def from_options(cls, options: Any) -> Knobs:
        if options is None:
            return cls()
        return cls(**{name: getattr(options, name) for name in cls.__dataclass_fields__})


_prompt_cache: dict[str, dict[str, list[str]]] = {}


def load_prompts(path: str) -> dict[str, list[str]]:
    """{'short': [...], 'long': [...]} read once per process."""
    if path not in _prompt_cache:
        data = json.loads(Path(path).read_text())
        _prompt_cache[path] = {"short": list(data["short"]), "long": [doc["prompt"] for doc in data["long"]]}
    return _prompt_cache[path]


# --- one row per request event, for the soak report -------------------------------
request_log = CsvLog(REQUESTS_CSV_HEADER)


@events.init.add_listener
def open_request_log(environment: Any, **_: Any) -> None:
    options = environment.parsed_options
    request_log.open(getattr(options, "requests_csv", "") if options is not None else "")


@events.request.add_listener
def log_request(
    request_type: str, name: str, response_time: float, response_length: int, exception: Any = None, **_: Any
) -> None:
    error = "" if exception is None else f"{type(exception).__name__}: {exception}"[:200]
    ok = int(exception is None)
    request_log.write_row(
        (f"{time.time():.3f}", request_type, name, f"{response_time:.1f}", response_length, ok, error)
    )


@events.quitting.add_listener
def close_request_log(**_: Any) -> None:
    request_log.close()


# --- a synchronous Chainlit socket.io session (gevent-friendly) --------------------
@dataclass
class Turn:
    """One message and its streamed answer, as the client saw it."""

    sent_at: float
    stop_after_pieces: int = 0  # > 0: `reached` is set once this many pieces streamed
    message_id: str | None = None
    pieces: int = 0
    chars: int = 0
    first_token_at: float | None = None
    final: str | None = None
    error: str | None = None
    first_token: threading.Event = field(default_factory=threading.Event)
    reached: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)

    def _piece(self, text: str) -> None:
        self.pieces += 1
        self.chars += len(text)
        if self.stop_after_pieces and self.pieces >= self.stop_after_pieces:
            self.reached.set()

    def _finish(self, final: str | None = None, error: str | None = None) -> None:
        self.final = final
        self.error = error
        for event in (self.first_token, self.reached, self.done):
            event.set()  # wake every waiter


class SyncChat:
    """One Chainlit chat session over the sync python-socketio client.

    The protocol is tests/chat_client.py's (see FIELD_NOTES): the first token
    arrives inside `stream_start.output`, the rest as `stream_token`, and the
    final text in `new_message`/`update_message` of the same message id.
    """

    def __init__(self, base_url: str, address: str) -> None:
        self.base_url = base_url
        self.address = address  # X-Forwarded-For: the person to the per-person limits
        self.session_id = str(uuid.uuid4())
        self.sio = socketio.Client(reconnection=False)
        self.turn: Turn | None = None
        self._dropping = False
        self.sio.on("stream_start", self._on_stream_start)
        self.sio.on("stream_token", self._on_stream_token)
        self.sio.on("new_message", self._on_message)
        self.sio.on("update_message", self._on_message)
        self.sio.on("disconnect", self._on_disconnect)

    # handlers run in the client's read-loop greenlet
    def _on_stream_start(self, data: dict) -> None:
        turn = self.turn
        if turn is None or turn.done.is_set() or data.get("type") != "assistant_message":
            return
        turn.message_id = data["id"]
        turn.first_token_at = time.monotonic()
        turn._piece(data.get("output") or "")
        turn.first_token.set()

    def _on_stream_token(self, data: dict) -> None:
        turn = self.turn
        if turn is not None and not turn.done.is_set() and data.get("id") == turn.message_id:
            turn._piece(data.get("token") or "")

    def _on_message(self, data: dict) -> None:
        turn = self.turn
        if turn is None or turn.done.is_set() or data.get("type") != "assistant_message":
            return
        if (data.get("metadata") or {}).get("status"):
            return  # the place-in-line status of a waiting turn, replaced by the answer: not the answer
        if turn.message_id is None and data.get("name") != "notice":
            turn.message_id = data["id"]  # answered without streaming (an error message)
        if data.get("id") == turn.message_id:
            turn._finish(final=data.get("output") or "")

    def _on_disconnect(self, *_: Any) -> None:
        turn = self.turn
        if not self._dropping and turn is not None and not turn.done.is_set():
            turn._finish(error="the server closed the connection mid-turn")

    # actions
    def connect(self, timeout: float = 10.0) -> None:
        connect_sync(self.sio, self.base_url, self.session_id, self.address, timeout)

    def update_settings(self, **values: Any) -> None:
        self.sio.emit("chat_settings_change", values)

    def send(self, text: str, stop_after_pieces: int = 0) -> Turn:
        turn = Turn(sent_at=time.monotonic(), stop_after_pieces=stop_after_pieces)
        self.turn = turn
        self.sio.emit("client_message", user_message_payload(text))
        return turn

    def close(self) -> None:
        """End the session politely, as "New chat" does (the server frees it at once)."""
        with contextlib.suppress(Exception):
            self.sio.call("clear_session", timeout=5)  # acknowledged: the server frees it at once
        with contextlib.suppress(Exception):
            self.sio.disconnect()

    def drop(self) -> None:
        """Vanish: shut the TCP socket with no websocket close frame and no socket.io goodbye."""
        self._dropping = True
        engine_io = self.sio.eio
        raw = getattr(engine_io.ws, "sock", None) if engine_io.ws is not None else None
        if raw is not None:
            with contextlib.suppress(OSError):
                raw.shutdown(socket.SHUT_RDWR)
        # The read loop sees the dead socket and tears the client down locally.
        reader = engine_io.read_loop_task
        if reader is not None:
            with contextlib.suppress(Exception):
                reader.join(timeout=5)
        if raw is not None:
            with contextlib.suppress(OSError):
                raw.close()


# --- the user ------------------------------------------------------------------------
def retry_hint_seconds(final: str) -> float | None:
    """The wait a refusal asks for ("Please try again in ~40 s"), in seconds; None if it is no refusal."""
    match = RETRY_HINT.search(final)
    if match is None:
        return None
    return float(match.group(1)) * {"s": 1, "min": 60, "h": 3600}[match.group(2)]


class ChatUser(User):
    """A person chatting: sessions of a few messages; some people vanish mid-answer."""

    wait_time = between(0.1, 0.5)
    _numbers = itertools.count()

    def __init__(self, environment: Any) -> None:
        super().__init__(environment)
        self.knobs = Knobs.from_options(environment.parsed_options)
        self.prompts = load_prompts(self.knobs.prompts_file)
        # Exactly floor(n * fraction) of the first n users vanish (no sampling noise).
        number = next(ChatUser._numbers)
        fraction = self.knobs.vanish_fraction
        self.vanishes = math.floor((number + 1) * fraction) > math.floor(number * fraction)
        self.address = f"10.88.{number // 250}.{number % 250 + 1}"
        self.rng = random.Random()
        self.chat: SyncChat | None = None
        self.turns_left = 0
        self.failed_connects = 0  # in a row: the next try waits as a browser's would

    def on_stop(self) -> None:
        if self.chat is not None:
            self.chat.close()
            self.chat = None

    @task
    def chat_turn(self) -> None:
        if self.chat is None and not self._open_session():
            return
        assert self.chat is not None
        kind = "long" if self.rng.random() < self.knobs.long_fraction else "short"
        text = self.rng.choice(self.prompts[kind])
        self.turns_left -= 1
        if self.turns_left <= 0 and self.vanishes:
            self._vanishing_turn(kind, text)
            return
        completed = self._full_turn(kind, text)
        if not completed or self.turns_left <= 0:
            self.chat.close()
            self.chat = None

    # --- steps ---------------------------------------------------------------------
    def _open_session(self) -> bool:
        chat = SyncChat(self.host, self.address)
        started = time.monotonic()
        try:
            chat.connect()
            settings: dict[str, Any] = {"max_new_tokens": self.knobs.max_new_tokens}
            if self.knobs.temperature >= 0:
                settings["temperature"] = self.knobs.temperature
            chat.update_settings(**settings)
        except Exception as error:
            self._fire("socketio", "connect", started, exception=error)
            chat.close()
            self.failed_connects += 1
            time.sleep(reconnect_delay_seconds(self.failed_connects, self.rng))  # gevent's sleep
            return False
        self._fire("socketio", "connect", started)
        self.failed_connects = 0
        self.chat = chat
        self.turns_left = self.rng.randint(1, max(1, self.knobs.turns_per_session))
        return True

    def _full_turn(self, kind: str, text: str) -> bool:
        """Send, stream the whole answer; True when it completed without error."""
        assert self.chat is not None
        turn = self.chat.send(text)
        timeout = self.knobs.turn_timeout
        if turn.first_token.wait(timeout) and turn.first_token_at is not None:
            self._fire("chat", f"ttft {kind}", turn.sent_at, end=turn.first_token_at)
        left = timeout - (time.monotonic() - turn.sent_at)
        if not turn.done.wait(max(0.0, left)):
            self._fire(
                "chat", f"total {kind}", turn.sent_at, turn.chars, TimeoutError(f"no answer in {timeout:g} s")
            )
            return False
        final = turn.final or ""
        if self._waited_out_refusal(turn):
            return True
        if turn.error is not None or ERROR_MARK in final or turn.first_token_at is None:
            problem = turn.error or (final.strip()[:160] or "answered without streaming")
            self._fire("chat", f"total {kind}", turn.sent_at, len(final), RuntimeError(problem))
            return False
        self._fire("chat", f"total {kind}", turn.sent_at, len(final))
        return True

    def _vanishing_turn(self, kind: str, text: str) -> None:
        """Send, wait for a few streamed pieces, then vanish without a goodbye."""
        assert self.chat is not None
        chat, self.chat = self.chat, None
        turn = chat.send(text, stop_after_pieces=self.rng.randint(1, 8))
        reached = turn.reached.wait(self.knobs.turn_timeout)
        if turn.first_token_at is not None:
            self._fire("chat", f"ttft {kind}", turn.sent_at, end=turn.first_token_at)
        chat.drop()
        if self._waited_out_refusal(turn):  # refused before it streamed: nothing to vanish from
            return
        if not reached or turn.error is not None or turn.first_token_at is None:
            problem = turn.error or f"no streamed answer in {self.knobs.turn_timeout:g} s"
            self._fire("chat", "vanish", turn.sent_at, turn.chars, RuntimeError(problem))
        else:
            self._fire("chat", "vanish", turn.sent_at, turn.chars)

    def _waited_out_refusal(self, turn: Turn) -> bool:
        """If the turn was refused with a retry hint: count it and wait the hint out, as a person does."""
        final = turn.final or ""
        retry_after = retry_hint_seconds(final) if turn.first_token_at is None else None
        if retry_after is None:
            return False
        self._fire("chat", "refused", turn.sent_at, len(final))
        time.sleep(min(retry_after, MAX_RETRY_WAIT_S))  # gevent's: other users go on
        return True

    def _fire(
        self,
        request_type: str,
        name: str,
        started: float,
        length: int = 0,
        exception: BaseException | None = None,
        end: float | None = None,
    ) -> None:
        elapsed_ms = ((end if end is not None else time.monotonic()) - started) * 1000
        self.environment.events.request.fire(
            request_type=request_type,
            name=name,
            response_time=elapsed_ms,
            response_length=length,
            exception=exception,
            context={},
        )
