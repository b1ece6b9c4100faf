"""What the fuzz tests share: hostile values as Hypothesis strategies (and the socket events the page
never sends, as a list), and the checks every attack must leave true (the server answers, its log
holds no traceback, nothing outside its folders changed, Bob's conversation is as it was).

Hostile values may hold placeholders (`{canary}`, `{bob_thread}`, `{new_uuid}`, ...) that `render`
replaces with this run's values, so a drawn example names real victims and reads the same every run.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st

from harness.chat_client import handshake, user_message_payload


def fuzz_settings() -> settings:
    """The loaded profile's budget (tests/tiers.py: `ci` the same small draw every run, `long` ten
    times more, random), every health check off (drawing a hostile value may be slow), and no
    shrinking: each example costs requests to a real server, and a failure message already names
    the exact input."""
    return settings(phases=(Phase.explicit, Phase.generate), suppress_health_check=list(HealthCheck))


# --- hostile values ------------------------------------------------------------------------------

HOSTILE_STRINGS = (
    "",
    " ",
    ".",
    "..",
    "../",
    "/",
    "{canary}",
    "{canary}/x",
    "../../../../../../{canary_rel}",
    "..%2f..%2f..%2f{canary_rel}",
    "%2e%2e%2f%2e%2e%2f",
    "%252e%252e%252f",
    "..\\..\\windows",
    "/etc/passwd",
    "file:///etc/passwd",
    "x' OR '1'='1",
    "'; DROP TABLE threads; --",
    '"',
    "\x00",
    "a\x00b",
    "\r\nSet-Cookie: a=b",
    "\ud800",
    "a" * 10_000,
    "é" * 3000,
    "🙂" * 1000,
    "{bob_thread}",
    "{bob_step}",
    "{bob_thread}' --",
    "{new_uuid}",
    "{alice_session}",
    "00000000-0000-0000-0000-000000000000",
    "6ba7b810-9dad-11d1-80b4-00c04fd430c8",  # a version 1 UUID
    "NaN",
    "null",
    "[]",
    "__proto__",
    "<script>alert(1)</script>",
)
hostile_text = st.one_of(
    st.sampled_from(HOSTILE_STRINGS),
    st.text(max_size=40),
    st.text(st.characters(codec="utf-8"), min_size=1, max_size=300),
)
json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    hostile_text,
)
hostile_value = st.recursive(
    json_scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(hostile_text, inner, max_size=4)),
    max_leaves=12,
)
# Ids that name something real (a live session, Bob's conversation, a message of his, a new id):
# drawn as often as all other hostile ids together, so each route meets them.
named_ids = st.sampled_from(("{new_uuid}", "{bob_thread}", "{bob_step}", "{alice_session}"))
hostile_id = st.one_of(named_ids, st.sampled_from(HOSTILE_STRINGS), hostile_text, hostile_value)


def deep_json(depth: int) -> str:
    """JSON text of a 1 inside `depth` levels of alternating lists and objects (built as text: a
    value this deep is past what Python's own encoder and decoder take)."""
    opening, closing = [], []
    for level in range(depth):
        opening.append("[" if level % 2 else '{"a":')
        closing.append("]" if level % 2 else "}")
    return "".join(reversed(opening)) + "1" + "".join(closing)


# Socket events the page never sends, each of which once logged a traceback or left a Chainlit session
# behind: sent on a real server (test_malformed_input.py) and to the rules alone
# (tests/unit/security/test_socket_events.py).
MALFORMED_EVENTS: list[tuple[str, tuple[Any, ...]]] = [
    ("client_message", ("x",)),
    ("client_message", ({"message": {"id": "..", "output": 5}},)),
    (
        "client_message",
        ({"message": {**user_message_payload("Hi.")["message"], "type": "assistant_message"}},),
    ),
    ("edit_message", ({"message": {"id": str(uuid.uuid4()), "output": "edited"}},)),  # not the page's shape
    ("stop", ("x",)),
    ("clear_session", ({"a": 1},)),
    ("connection_successful", (1,)),
    ("chat_settings_change", ([1, 2],)),
    ("chat_settings_change", ()),
    ("audio_end", ()),  # audio is off
    ("message_favorite", ({"message": {"id": "x"}},)),  # favorites are off
    ("connect", ({"HTTP_COOKIE": ""}, handshake(str(uuid.uuid4())))),
    ("disconnect", ()),
    ("window_message", ({"deep": json.loads(deep_json(20))},)),
]


@dataclass(frozen=True)
class Deep:
    """A value `depth` levels deep, sent as raw JSON text."""

    depth: int

    @property
    def text(self) -> str:
        return deep_json(self.depth)


NESTING_DEPTHS = (64, 1_000, 5_000, 50_000)


def sometimes(valid: Any, hostile: st.SearchStrategy = hostile_value) -> st.SearchStrategy:
    """The value the page would send, or a hostile one instead."""
    return st.one_of(st.just(valid), hostile)


# --- placeholders --------------------------------------------------------------------------------


@dataclass
class Victims:
    """This run's values for the placeholders: the canary folder, Bob's ids, Alice's cookie."""

    canary: Path
    bob_thread: str
    bob_step: str
    alice_cookie: str
    alice_session: str = ""  # a live session of Alice's, where a test keeps one

    def replace(self, text: str) -> str:
        if "{" not in text:
            return text
        values = {
            "{canary}": str(self.canary),
            "{canary_rel}": str(self.canary.relative_to(self.canary.anchor)),
            "{bob_thread}": self.bob_thread,
            "{bob_step}": self.bob_step,
            "{alice_cookie}": self.alice_cookie,
            "{alice_session}": self.alice_session,
        }
        for name, value in values.items():
            text = text.replace(name, value)
        while "{new_uuid}" in text:
            text = text.replace("{new_uuid}", str(uuid.uuid4()), 1)
        return text


def render(value: Any, victims: Victims) -> Any:
    """`value` with every placeholder in its strings (keys too) replaced."""
    if isinstance(value, str):
        return victims.replace(value)
    if isinstance(value, list | tuple):
        return type(value)(render(item, victims) for item in value)
    if isinstance(value, dict):
        return {render(key, victims): render(item, victims) for key, item in value.items()}
    return value


def json_safe(value: Any) -> bool:
    """False for values a strict JSON encoder refuses (NaN, infinities); they are sent raw instead."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list | tuple):
        return all(json_safe(item) for item in value)
    if isinstance(value, dict):
        return all(json_safe(item) for item in value.values())
    return True


# --- what must stay true -------------------------------------------------------------------------

# Lines of the server's log that mean an input reached code that did not expect it: a traceback
# anywhere (vLLM prefixes each of its lines with its level), an error of the app or Chainlit. vLLM's
# one-line ERROR records of answers it refused (an unknown model) are its log of errors, not failures.
PROBLEM_LINE = re.compile(
    r"Traceback \(most recent call last\)| - (ERROR|CRITICAL) - |Task exception was never"
)
# Clean refusals that Chainlit 2.12 logs at ERROR level (socket.py, connect), without a traceback.
CLEAN_REFUSALS = (
    " - ERROR - chainlit - Authentication failed in websocket connect.",
    " - ERROR - chainlit - Authorization for the thread failed.",
)


class ServerLog:
    """The shared server's log, read from a mark on: what the server said during one attack."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def mark(self) -> int:
        return self.path.stat().st_size

    def since(self, mark: int) -> str:
        with self.path.open("rb") as log:
            log.seek(mark)
            return log.read().decode(errors="replace")

    def problems_since(self, mark: int, context: int = 12) -> list[str]:
        """Each error line or traceback written after `mark`, with the lines that follow it."""
        lines, problems, index = self.since(mark).splitlines(), [], 0
        while index < len(lines):
            if PROBLEM_LINE.search(lines[index]) and not lines[index].endswith(CLEAN_REFUSALS):
                problems.append("\n".join(lines[index : index + context]))
                index += context
            else:
                index += 1
        return problems


def tree_digest(folder: Path) -> dict[str, str]:
    """Every file under `folder` (relative path) with a digest of its content."""
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


@dataclass
class Surroundings:
    """What a request may never change: a canary folder (named by hostile ids), the names in the
    server's data folder and in its working folder, and the names in Chainlit's upload folder
    (every one a session UUID)."""

    canary: Path
    data_dir: Path
    work_dir: Path
    files_dir: Path
    before: dict[str, Any] = field(default_factory=dict)

    def snapshot(self) -> dict[str, Any]:
        return {
            "canary": tree_digest(self.canary),
            "data_dir": sorted(p.name for p in self.data_dir.iterdir()),
            "work_dir": sorted(p.name for p in self.work_dir.iterdir()),
        }

    def remember(self) -> None:
        self.before = self.snapshot()

    def changes(self) -> list[str]:
        now = self.snapshot()
        changed = [
            f"{name}: {self.before[name]} -> {now[name]}" for name in now if now[name] != self.before[name]
        ]
        strangers = [p.name for p in self.files_dir.iterdir()] if self.files_dir.exists() else []
        changed += [f"{self.files_dir}/{name} is no session UUID" for name in strangers if not is_uuid(name)]
        return changed


def is_uuid(value: Any) -> bool:
    try:
        return isinstance(value, str) and str(uuid.UUID(value)) == value.lower()
    except ValueError:
        return False


def make_canary(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "precious.db").write_text("keep me")
    (folder / "inner").mkdir(exist_ok=True)
    (folder / "inner" / "notes.txt").write_text("keep me too")
    return folder
