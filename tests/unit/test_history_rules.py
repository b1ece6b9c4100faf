"""History's rules without a database: which steps a long conversation loses, how a resumed session
is rebuilt from stored steps, and when a disconnected session goes (on real SQLite and PostgreSQL:
tests/system/history/test_history.py).
"""

from __future__ import annotations

import json

from services.chat.store import SessionStore
from services.config import Settings
from services.history import conversations
from services.history.resume import ANSWER_METADATA, history_from_steps, unanswered_message


def test_a_long_conversation_loses_its_oldest_turns_whole() -> None:
    rows: list[tuple[str, str | None, str, str]] = [("start", None, "00", "run")]
    for turn in range(4):
        at = f"{turn + 1:02d}"
        rows += [(f"u{turn}", None, at, "user_message"), (f"r{turn}", f"u{turn}", f"{at}.1", "run"),
                 (f"a{turn}", f"r{turn}", f"{at}.2", "assistant_message")]  # fmt: skip
    rows.append(("late", "r1", "09", "assistant_message"))  # turn 1's answer, begun after turn 3's
    assert conversations.steps_before_last_turns(rows, 2) == sorted(
        ["start", "u0", "r0", "a0", "u1", "r1", "a1", "late"]
    )
    assert conversations.steps_before_last_turns(rows, 4) == []
    tied = [("x", None, "05", "user_message"), ("y", None, "05", "user_message"), ("z", "x", "06", "run")]
    assert conversations.steps_before_last_turns(tied, 1) == ["x", "z"], "exactly one turn is left"


def test_rebuild_rules_match_the_live_history() -> None:
    steps = [
        {"type": "user_message", "output": "hello"},
        {"type": "assistant_message", "output": "hi there", "metadata": json.dumps(ANSWER_METADATA)},
        {"type": "user_message", "output": "/stats"},
        {"type": "assistant_message", "output": "numbers", "metadata": {}},  # a report
        {"type": "assistant_message", "output": "Task manually stopped.", "metadata": {}},
        {"type": "user_message", "output": "x" * 50},  # over the limit: refused, never in history
        {"type": "user_message", "output": ""},  # a file with no words: a summary request
        {"type": "assistant_message", "output": "a summary", "metadata": ANSWER_METADATA},
        {"type": "tool", "output": "«a.txt»: 10 tokens."},
    ]
    assert history_from_steps(steps, max_message_chars=40, document_name="a.txt") == [
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "hi there"},
        {"role": "user", "content": "Summarize «a.txt»."},
        {"role": "assistant", "content": "a summary"},
    ]


def test_disconnected_session_waits_for_its_page_then_goes() -> None:
    now = [0.0]
    store = SessionStore(Settings.from_env({}), timer=lambda: now[0])
    session = store.open("s", "alice")
    session.history.append({"role": "user", "content": "kept"})
    store.disconnect("s", keep_seconds=120)
    now[0] = 100
    assert store.expire() == 0 and store.awaiting_reconnect() == 1
    assert store.open("s") is session and session.reconnect_deadline is None, "the page came back"
    store.disconnect("s", keep_seconds=120)
    now[0] = 221
    assert store.expire() == 1 and len(store) == 0 and store.dropped_total["not_reconnected"] == 1
    assert not session.history, "its state is freed"


def test_a_last_message_without_an_answer_is_found() -> None:
    def step(kind: str, text: str) -> dict[str, str]:
        return {"type": kind, "output": text}

    answered = [step("user_message", "Hi"), step("assistant_message", "Hello!")]
    assert unanswered_message(answered) is None
    assert unanswered_message([*answered, step("user_message", "And then?")]) == "And then?"
    assert unanswered_message([*answered, step("user_message", "/stats")]) is None, "a command"
    assert unanswered_message([*answered, step("user_message", "x"), step("run", "")]) == "x"
    assert unanswered_message([]) is None
