"""Smoke test: the default model, as `scripts/run.sh` serves it, answers correctly."""

from __future__ import annotations

import pytest

from harness.chat_client import ChatClient
from harness.server import AppServer

pytestmark = pytest.mark.asyncio(loop_scope="module")


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
    status = await default_server.poll(lambda s: s["sessions"] == 0, timeout=5)
    assert status["engine_unfinished_requests"] == 0
