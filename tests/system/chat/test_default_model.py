"""The default model, as `scripts/run.sh` serves it: warmed up before ready, and it answers correctly."""

from __future__ import annotations

import asyncio
import statistics

import pytest

from harness.chat_client import ChatClient
from harness.server import AppServer
from harness.waiting import WAIT_SECONDS
from tests.conftest import ServerPool

pytestmark = pytest.mark.asyncio(loop_scope="module")

# The default server is shared (tests/conftest.py, ServerPool): the first test here needs the first
# question the server ever gets, so this module runs first on it.
FIRST_ON_ITS_SERVER = True

QUESTIONS = (
    "What is the capital of France?",
    "What is the capital of Spain?",
    "What is the capital of Italy?",
    "What is the capital of Japan?",
)


async def first_token_seconds(server: AppServer, question: str) -> float:
    """TTFT of `question` in a new session (same prompt shape each time: system prompt + one question)."""
    client = ChatClient(server.base_url)
    await client.connect()
    try:
        await client.update_settings(max_new_tokens=8, temperature=0)
        reply = await client.ask(question, timeout=120)
        assert reply.final and reply.ttft_seconds is not None
        return reply.ttft_seconds
    finally:
        await client.close()


# First in this module: it needs the first question the server ever gets.
@pytest.mark.long  # a ratio of first-token times: bench/engine and BENCHMARKS.md hold the verdict
async def test_the_first_question_after_start_is_close_to_a_warm_one(
    default_server: AppServer, server_pool: ServerPool
) -> None:
    assert server_pool.users[id(default_server)] == [__name__], "no other module asked it anything yet"
    status = await default_server.astatus()
    warm_up = status["warm_up"]
    assert warm_up["seconds"] > 0 and warm_up["prompt_ttft_seconds"] and warm_up["decode_seconds_per_token"]
    code, health = await asyncio.to_thread(default_server.healthz)
    assert (code, health["status"]) == (200, "ok"), "ready means warmed up"
    first = await first_token_seconds(default_server, QUESTIONS[0])
    warm = statistics.median([await first_token_seconds(default_server, q) for q in QUESTIONS[1:]])
    assert first <= 2.0 * warm, f"first question {first:.2f} s, warm ones {warm:.2f} s (median)"


async def test_default_model_knows_the_capital_of_france(default_server: AppServer) -> None:
    client = ChatClient(default_server.base_url)
    await client.connect()
    try:
        await client.update_settings(temperature=0.0)
        reply = await client.ask("What is the capital of France?")
    finally:
        await client.close()
    assert "Paris" in reply.final
    assert "<|im_end|>" not in reply.final, "generation stops at the end-of-turn token"
    assert reply.streamed_text == reply.final
    status = await default_server.poll(lambda s: s["sessions"] == 0, timeout=WAIT_SECONDS)
    assert status["engine_unfinished_requests"] == 0
