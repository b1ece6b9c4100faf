"""Fakes that stand in for the engine, the clock and the chat page in more than one test module
(a fake one module needs stays in that module). Each records what it was asked, for the test to check.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

from services.admission.refusals import Refused
from services.engine.chat_engine import Message, SamplingSettings


class WordEngine:
    """A chat engine that counts words as tokens and streams one word ("word ") every 10 ms until
    its answer is done or it is cancelled; it keeps each request's prompt and sampling, the requests
    that sent their first word (`streamed`) and those cancelled (`aborted`).

    `max_model_len`: its context; `message_overhead_tokens`: what its chat template adds to each
    message; `fails_with`: an exception every request raises instead of answering (an engine whose
    own queue is full, say).
    """

    def __init__(
        self,
        max_model_len: int = 100,
        message_overhead_tokens: int = 1,
        fails_with: type[Exception] | None = None,
    ) -> None:
        self.max_model_len = max_model_len
        self.message_overhead_tokens = message_overhead_tokens
        self.fails_with = fails_with
        self.prompts: list[list[dict[str, str]]] = []
        self.samplings: list[SamplingSettings] = []
        self.streamed: list[str] = []  # the requests that sent their first word
        self.aborted: list[str] = []

    def encode_chat(self, messages: list[Message]) -> list[int]:
        return [0] * sum(len(m["content"].split()) + self.message_overhead_tokens for m in messages)

    def count_tokens(self, text: str) -> int:
        return len(text.split())

    def on_finish(self, callback):  # the summarizer learns the prefill speed from finished requests
        return lambda: None

    async def generate(
        self, messages, sampling: SamplingSettings, request_id: str, **options: Any
    ) -> AsyncIterator[str]:
        self.prompts.append([dict(m) for m in messages])
        self.samplings.append(sampling)
        if self.fails_with is not None:
            raise self.fails_with()
        try:
            for index in range(sampling.max_new_tokens):
                await asyncio.sleep(0.01)
                if index == 0:
                    self.streamed.append(request_id)
                yield "word "
        except BaseException:
            self.aborted.append(request_id)
            raise


class FakeClock:
    """A clock that stands still until the test moves it (`clock.now += seconds`): pass it where the
    code takes a `() -> float` time function."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class FakeReply:
    """One answer on a FakePage: what was streamed into it, and how often it was sent."""

    def __init__(self) -> None:
        self.id = str(uuid.uuid4())
        self.content = ""
        self.metadata: dict[str, Any] = {"answer": True}
        self.sent = 0

    async def stream_token(self, token: str) -> None:
        self.content += token

    async def send(self) -> None:
        self.sent += 1

    async def update(self) -> None:
        pass


class FakePage:
    """The chat page a turn talks to (services/chat/turns.py): records what the turn shows, in order,
    in `shown`, and its answers in `replies`."""

    session_id = "tab-1"
    user_identifier = None
    chosen_model = None
    thread_id = "thread-1"

    def __init__(self) -> None:
        self.replies: list[FakeReply] = []
        self.shown: list[tuple[str, Any]] = []
        self.forgotten = 0

    def person(self) -> str:
        return "address:127.0.0.1"

    def reply(self) -> FakeReply:
        self.replies.append(FakeReply())
        return self.replies[-1]

    def status(self):
        async def show(text: str | None) -> None:
            self.shown.append(("status", text))

        return show

    def summary_progress(self):
        async def report(update) -> None:
            self.shown.append(("progress", update))

        return report

    @contextlib.asynccontextmanager
    async def reading(self) -> AsyncIterator[SimpleNamespace]:
        step = SimpleNamespace(output="")
        yield step
        self.shown.append(("read", step.output))

    async def refused(self, refusal: Refused) -> None:
        self.shown.append(("refused", refusal.reason))

    async def error(self, text: str) -> None:
        self.shown.append(("error", text))

    async def notice(self, text: str) -> None:
        self.shown.append(("notice", text))

    async def send_settings(self, session, max_new_tokens_limit: int) -> None:
        self.shown.append(("settings", max_new_tokens_limit))

    def keep_settings(self, values: dict[str, Any]) -> None:
        self.shown.append(("kept settings", values))

    def forget(self) -> None:
        self.forgotten += 1

    async def offer_regenerate(self, answer_id: str | None) -> None:
        self.shown.append(("regenerate offered", answer_id))

    async def remove_messages(self, ids: list[str]) -> None:
        self.shown.append(("removed", ids))

    async def show_edited(self, message_id: str, text: str) -> None:
        self.shown.append(("edited", text))

    @contextlib.asynccontextmanager
    async def run(self, message_id: str | None) -> AsyncIterator[None]:
        self.shown.append(("run", message_id))
        yield


class MemoryUsageStore:
    """The usage tables as UsageLedger reads them (services/usage/store.py), in memory: each person's
    tokens used so far today and this month, and their own day budget; writes are kept in `added`."""

    def __init__(self) -> None:
        self.spent: dict[str, tuple[int, int]] = {}  # person: (today, this month)
        self.day_budgets: dict[str, int] = {}
        self.added: list[dict] = []

    async def totals(self, people, today: str) -> dict[str, tuple[int, int]]:
        return {person: self.spent[person] for person in people if person in self.spent}

    async def budgets(self, people) -> dict[str, tuple[str | None, dict[str, int]]]:
        return {p: ("user", {"day": self.day_budgets[p]}) for p in people if p in self.day_budgets}

    async def add(self, rows: dict) -> None:
        self.added.append(dict(rows))
