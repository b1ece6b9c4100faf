"""The churn's own parts without a model: when samples are taken and what the app-like requests are
(the churn itself: tests/system/memory/test_churn.py).
"""

from __future__ import annotations

from bench.memory.churn import (
    ChurnOptions,
    Workload,
    settle_seconds,
)
from services.config import Settings


def test_samples_wait_out_jemallocs_decay_and_no_longer_than_the_bound() -> None:
    assert settle_seconds({}) == 0.5
    assert settle_seconds({"MALLOC_CONF": "background_thread:true,dirty_decay_ms:1000"}) == 1.5
    assert settle_seconds({"MALLOC_CONF": "dirty_decay_ms:-1,muzzy_decay_ms:3000"}) == 3.5
    assert settle_seconds({"MALLOC_CONF": "dirty_decay_ms:600000"}) == 15.5


def test_app_like_requests_are_interleaved_conversations_whose_turns_extend_the_history() -> None:
    conversations, turns = 5, 3
    options = ChurnOptions(conversations=conversations, turns=turns, max_prompt_words=200, abort_fraction=0)
    settings = Settings.from_env(
        {"FREQUENCY_PENALTY": "1.0", "DOCUMENT_AGING_SECONDS": "30", "PRIORITY_SCHEDULING": "true"}
    )
    workload = Workload(options, settings)
    first, second, third = (workload.plan(2 + conversations * turn) for turn in range(turns))
    assert workload.conversation_turn(2) == (2, 0) and workload.conversation_turn(2 + conversations) == (2, 1)
    assert first.prose and first.sampling.min_new_tokens >= 1 and first.priority >= 30, "a document summary"
    assert first.messages[1]["content"].startswith("Summarize")
    assert second.messages[: len(first.messages)] == first.messages, "a follow-up repeats the history"
    assert third.messages[: len(second.messages)] == second.messages
    assert len(third.messages) == len(first.messages) + 4
    assert not second.prose and second.priority < 30 and second.sampling.frequency_penalty == 1.0
    after = workload.plan(2 + conversations * turns)  # the conversation is over: a new one begins
    assert workload.conversation_turn(2 + conversations * turns) == (2 + conversations, 0)
    assert after.prose and after.messages[1] != first.messages[1]
    independent = Workload(ChurnOptions(), settings).plan(2)
    assert len(independent.messages) == 2 and independent.priority == 0 and not independent.prose
