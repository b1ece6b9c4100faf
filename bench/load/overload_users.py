"""Locust users for bench/load/overload.py: people chatting and sending documents over Chainlit's socket.io.

Run by bench/load/overload.py (one Locust process per arm); by hand:
    .venv/bin/locust -f bench/load/overload_users.py --headless -u 50 -r 5 -t 10m \
        --host http://127.0.0.1:8000 --turns-csv turns.csv

Each user is a person of their own (an X-Forwarded-For address the app trusts from loopback). How
they behave is the --pattern:
    patient  sessions of 1..3 turns, 1-3 s of thought between turns; a share of turns upload a
             document (most fit the context and are summarized in one pass, some need map-reduce
             parts) and ask for its summary, the rest are short questions; after a refused turn
             the person waits 5-15 s
    storm    one session, the next message 0.1-0.5 s after every answer or refusal
    think    one session, 2-8 s of thought after every answer or refusal
--leave-after-first-token makes that share of turns close their page at their first token (the
next turn opens a new one). Without --accounts everyone signs in as the local user (told apart by
address); with --accounts PREFIX user N signs in with the password form as PREFIXN (the password in
$OVERLOAD_ACCOUNT_PASSWORD) and keeps the cookies the answer set, as a browser does: behind
deploy/haproxy.cfg that includes the sticky cookie, so all of a person's pages, sockets and uploads
go to one replica (the `replica` column; a new page takes the new cookie the balancer sets when that
replica is down). One CSV row per finished turn records what the person saw and when:
refusal and how fast it came, status updates (place in line), first token, tokens, the end, and
for a session's first turn how long its page took to open (connect until the chat started).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import os
import random
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import socketio
from locust import User, events, task

from bench.load.deployments import PASSWORD_ENV, browser_cookie, merged_cookie, person_address, replica_of
from harness.chat_client import client_headers, connect_sync, user_message_payload
from harness.csv_log import CsvLog
from harness.documents import long_document

PROMPTS_FILE = Path(__file__).resolve().parents[1] / "data" / "prompts.json"
TURN_COLUMNS = (
    "user",
    "kind",
    "sent_unix",
    "outcome",
    "refused_reason",
    "told_seconds",
    "ttft_seconds",
    "first_signal_seconds",
    "max_silence_seconds",
    "tokens",
    "stream_seconds",
    "total_seconds",
    "connection_lost_seconds",
    "connect_seconds",
    "replica",
)
PATTERNS = ("patient", "storm", "think")
THINK_SECONDS = {"patient": (1.0, 3.0), "storm": (0.1, 0.5), "think": (2.0, 8.0)}
SINGLE_PASS_WORDS = (800, 1200, 1800, 2500)
MAP_REDUCE_WORDS = 7000  # over the 8,192-token context: summarized in parts


@events.init_command_line_parser.add_listener
def add_options(parser: Any) -> None:
    group = parser.add_argument_group("overload")
    group.add_argument("--turns-csv", default="", help="Append one row per turn to this CSV file.")
    group.add_argument(
        "--document-fraction", type=float, default=0.1, help="Share of turns that are documents."
    )
    group.add_argument("--map-reduce-fraction", type=float, default=0.2, help="Share of documents in parts.")
    group.add_argument(
        "--max-new-tokens", type=int, default=64, help="Answer budget each page sets (0: the app's)."
    )
    group.add_argument(
        "--turn-timeout", type=float, default=300.0, help="Seconds before a turn counts as unfinished."
    )
    group.add_argument("--pattern", choices=PATTERNS, default="patient", help="How people resend.")
    group.add_argument(
        "--cookies", default="", help="JSON file: person number -> the cookies of a sign-in made before."
    )
    group.add_argument(
        "--leave-after-first-token", type=float, default=0.0, help="Share of turns whose page closes then."
    )
    group.add_argument(
        "--accounts", default="", help="Sign in as PREFIX<n> with the password form (default: local user)."
    )


turn_log = CsvLog(TURN_COLUMNS)  # one row per turn


@events.init.add_listener
def open_turn_log(environment: Any, **_: Any) -> None:
    turn_log.open(getattr(environment.parsed_options, "turns_csv", "") if environment.parsed_options else "")


@events.quitting.add_listener
def close_turn_log(**_: Any) -> None:
    turn_log.close()


@dataclass
class Turn:
    """One message and what came back, with the client's clock."""

    sent_at: float
    signals: list[float] = field(default_factory=list)  # every message event the person could see
    answer_id: str | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    pieces: int = 0
    final_at: float | None = None
    refused: str | None = None
    failed: bool = False
    connection_lost_at: float | None = None  # the server closed the socket before the turn ended
    leave_at_first_token: bool = False  # the person closes the page as the answer starts
    connect_seconds: float | None = None  # the session's first turn: how long its page took to open
    done: threading.Event = field(default_factory=threading.Event)


def page_cookie(base_url: str, address: str, cookie: str) -> str:
    """The cookies after the page loaded: a page whose replica is down is sent to another, which
    the balancer's new sticky cookie names (a browser keeps it, and its socket and uploads follow)."""
    response = httpx.get(f"{base_url}/auth/config", headers=client_headers(address, cookie), timeout=60)
    return merged_cookie(cookie, dict(response.cookies.items()))


class Person:
    """One chat session over the sync socket.io client, as a browser tab sees it."""

    def __init__(self, base_url: str, address: str, cookie: str | None) -> None:
        self.base_url = base_url
        self.address = address
        self.cookie = cookie
        self.session_id = str(uuid.uuid4())
        self.sio = socketio.Client(reconnection=False)
        self.turn: Turn | None = None
        self.chat_started = threading.Event()  # the app sent the chat's settings panel
        for name in ("stream_start", "stream_token", "new_message", "update_message", "delete_message"):
            self.sio.on(name, self._handler(name))
        self.sio.on("chat_settings", lambda *_: self.chat_started.set())
        self.sio.on("disconnect", self._lost)

    def _lost(self, *_: Any) -> None:
        """The socket closed (not by us: close() forgets the turn first); the turn cannot finish."""
        turn = self.turn
        if turn is not None and not turn.done.is_set():
            turn.connection_lost_at = time.monotonic()
            turn.done.set()

    def _handler(self, name: str):
        def handle(data: Any = None) -> None:
            turn = self.turn
            if turn is None or turn.done.is_set() or not isinstance(data, dict):
                return
            now = time.monotonic()
            turn.signals.append(now)
            self._on_event(turn, name, data, now)

        return handle

    def _on_event(self, turn: Turn, name: str, data: dict, now: float) -> None:
        metadata = data.get("metadata") or {}
        answer = (
            data.get("type") == "assistant_message"
            and not metadata.get("status")
            and data.get("name") != "notice"
        )
        if name == "stream_start" and answer:
            turn.answer_id = data["id"]
            turn.first_token_at = now
            turn.last_token_at = now
            turn.pieces = 1
            if turn.leave_at_first_token:
                turn.done.set()
        elif name == "stream_token" and data.get("id") == turn.answer_id:
            turn.pieces += 1
            turn.last_token_at = now
        elif name in ("new_message", "update_message") and answer:
            if turn.answer_id is None:
                turn.answer_id = data["id"]  # answered without streaming: a refusal or an error
            if data["id"] == turn.answer_id:
                turn.refused = metadata.get("refused")
                turn.failed = "⚠️" in (data.get("output") or "")
                turn.final_at = now
                turn.done.set()

    def headers(self) -> dict[str, str]:
        """This person's address and their browser's cookies."""
        return client_headers(self.address, self.cookie)

    def connect(self, timeout: float) -> float | None:
        """Open the page; seconds until the chat started (None: not within `timeout`)."""
        started = time.monotonic()
        connect_sync(self.sio, self.base_url, self.session_id, self.address, timeout, self.cookie or "")
        return time.monotonic() - started if self.chat_started.wait(timeout) else None

    def upload(self, name: str, data: bytes) -> str:
        response = httpx.post(
            f"{self.base_url}/project/file",
            params={"session_id": self.session_id},
            files={"file": (name, data, "text/plain")},
            headers=self.headers(),
            timeout=60,
        )
        response.raise_for_status()
        return response.json()["id"]

    def send(self, text: str, leave: bool = False, file_ids: list[str] | None = None) -> Turn:
        self.turn = Turn(sent_at=time.monotonic(), leave_at_first_token=leave)
        self.sio.emit("client_message", user_message_payload(text, file_ids))
        return self.turn

    def close(self) -> None:
        self.turn = None
        with contextlib.suppress(Exception):
            self.sio.disconnect()


def turn_row(turn: Turn, user: int, kind: str, timeout: float, replica: str = "") -> dict[str, Any]:
    """What the person saw, as one CSV row (times in seconds from sending)."""
    outcome = (
        "refused"
        if turn.refused
        else "failed"
        if turn.failed
        else "answered"
        if turn.final_at
        else "left"
        if turn.leave_at_first_token and turn.first_token_at
        else "connection_lost"
        if turn.connection_lost_at
        else "timeout"
    )
    until = turn.first_token_at or turn.final_at or turn.connection_lost_at or turn.sent_at + timeout
    marks = [turn.sent_at, *(s for s in turn.signals if s <= until), until]
    silence = max(b - a for a, b in itertools.pairwise(marks))
    stream = (
        (turn.last_token_at - turn.first_token_at) if turn.first_token_at and turn.last_token_at else None
    )
    return {
        "user": user,
        "kind": kind,
        "sent_unix": round(time.time() - (time.monotonic() - turn.sent_at), 3),
        "outcome": outcome,
        "refused_reason": turn.refused or "",
        "told_seconds": round(turn.final_at - turn.sent_at, 3) if turn.refused and turn.final_at else "",
        "ttft_seconds": round(turn.first_token_at - turn.sent_at, 3) if turn.first_token_at else "",
        "first_signal_seconds": round(turn.signals[0] - turn.sent_at, 3) if turn.signals else "",
        "max_silence_seconds": round(silence, 3),
        "tokens": turn.pieces,
        "stream_seconds": round(stream, 3) if stream is not None else "",
        "total_seconds": round(turn.final_at - turn.sent_at, 3) if turn.final_at else "",
        "connection_lost_seconds": (
            round(turn.connection_lost_at - turn.sent_at, 3) if turn.connection_lost_at else ""
        ),
        "connect_seconds": round(turn.connect_seconds, 3) if turn.connect_seconds is not None else "",
        "replica": replica,
    }


@functools.cache
def signed_in(path: str) -> dict[str, str]:
    """The sign-ins made before the load (--cookies), by person number; none without the file."""
    return json.loads(Path(path).read_text()) if path else {}


class Chatter(User):
    """A person: sessions of a few turns, mostly questions, sometimes a document (--pattern)."""

    _numbers = itertools.count(1)

    def wait_time(self) -> float:
        """Thought before the next turn, by the pattern."""
        return self.rng.uniform(*THINK_SECONDS[self.options.pattern])

    def __init__(self, environment: Any) -> None:
        super().__init__(environment)
        options = environment.parsed_options
        self.number = next(Chatter._numbers)
        self.address = person_address(self.number)
        self.rng = random.Random(self.number)
        self.options = options
        self.questions = json.loads(PROMPTS_FILE.read_text())["short"]
        self.person: Person | None = None
        self.cookie = signed_in(options.cookies).get(str(self.number))  # kept across its pages
        self.turns_left = 0

    def on_stop(self) -> None:
        if self.person is not None:
            self.person.close()

    @task
    def one_turn(self) -> None:
        patient = self.options.pattern == "patient"
        connect_seconds = None
        if self.person is None:
            if self.cookie is None:
                username = f"{self.options.accounts}{self.number}" if self.options.accounts else ""
                password = os.environ.get(PASSWORD_ENV, "")
                self.cookie = browser_cookie(self.host, self.address, username, password) or ""
            elif replica_of(self.cookie):
                self.cookie = page_cookie(self.host, self.address, self.cookie)
            person = Person(self.host, self.address, self.cookie)
            # A failure is Locust's error; the next task tries a new session.
            connect_seconds = person.connect(self.options.turn_timeout)
            if self.options.max_new_tokens:
                person.sio.emit("chat_settings_change", {"max_new_tokens": self.options.max_new_tokens})
            self.person = person
            self.turns_left = self.rng.randint(1, 3) if patient else 1_000_000
        document = self.rng.random() < self.options.document_fraction
        leave = self.rng.random() < self.options.leave_after_first_token
        turn = self._document_turn() if document else self.person.send(self.rng.choice(self.questions), leave)
        turn.connect_seconds = connect_seconds
        turn.done.wait(self.options.turn_timeout)
        kind = "document" if document else "chat"
        row = turn_row(turn, self.number, kind, self.options.turn_timeout, replica_of(self.cookie))
        turn_log.write_row([row.get(column, "") for column in TURN_COLUMNS])
        self.turns_left -= 1
        if turn.refused and patient:
            time.sleep(min(30.0, self.rng.uniform(5, 15)))
        left = turn.leave_at_first_token and turn.first_token_at is not None
        if self.turns_left <= 0 or not turn.done.is_set() or turn.connection_lost_at or left:
            self.person.close()
            self.person = None

    def _document_turn(self) -> Turn:
        assert self.person is not None
        in_parts = self.rng.random() < self.options.map_reduce_fraction
        words = MAP_REDUCE_WORDS if in_parts else self.rng.choice(SINGLE_PASS_WORDS)
        text = long_document(words, seed=self.rng.randrange(1_000_000))
        file_id = self.person.upload(f"report-{words}.txt", text.encode())
        return self.person.send("Summarize this document.", file_ids=[file_id])
