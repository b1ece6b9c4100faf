"""A real `chainlit run` server on the tiny model, driven over Chainlit's socket.io protocol."""

from __future__ import annotations

import asyncio
from pathlib import Path

import psutil
import pytest

from harness.chat_client import ChatClient
from harness.server import AppServer, vllm_processes_without_workarounds
from harness.waiting import WAIT_SECONDS
from services.config import Settings
from services.engine.backends.local import engine_processes
from services.memory import PRELOAD_LIBRARIES
from tests.conftest import ARTIFACTS, TINY_MAX_MODEL_LEN, server_env
from tests.system.helpers import connected, idle

pytestmark = pytest.mark.asyncio(loop_scope="module")

# The tiny server is shared (tests/conftest.py, ServerPool): this module runs first on it, as on a
# server of its own, so that twenty sessions at once meet the capacity the warm-up measured rather
# than one learned from the other modules' traffic.
FIRST_ON_ITS_SERVER = True

LONG_ANSWER_TOKENS = 3000
# Stop, a dropped page or a new message ends the engine request at once: well under a second on a
# quiet machine, a few with a core busy elsewhere; the bound stays far below the half minute or more
# the long answer would run for on the tiny model (~11 ms a token, warm-up log).
ABORTED_WITHIN_SECONDS = 10


async def start_long_answer(client: ChatClient, server: AppServer):
    reply = await client.start_long_answer(LONG_ANSWER_TOKENS)
    status = await server.astatus()
    assert status["engine_unfinished_requests"] == 1, status
    return reply


async def test_twenty_concurrent_sessions_stream_their_replies(tiny_server: AppServer) -> None:
    async with connected(tiny_server, 20) as clients:
        replies = await asyncio.gather(*(c.ask(f"Question number {i}?") for i, c in enumerate(clients)))
        for reply in replies:
            assert reply.final, "every session gets a non-empty answer"
            assert reply.streamed_text == reply.final, "streamed tokens add up to the final message"
            assert len(reply.streamed) > 1, "the answer was streamed, not sent whole"
        assert (await tiny_server.astatus())["sessions"] >= 20
    status = await tiny_server.poll(lambda s: s["sessions"] == 0, timeout=WAIT_SECONDS)
    assert idle(status)
    assert status["chainlit_chat_contexts"] == 0
    assert status["app_malloc"]["in_use_bytes"] > 0, "malloc's totals (glibc or jemalloc), live against kept"
    assert status["app_python_allocated_blocks"] > 0 and status["app_asyncio_tasks"] > 0
    assert status["app_tokenizer_copies"] >= 3, "the tokenizer, vLLM's pool's original and its copies"
    pymalloc = status["app_pymalloc"]  # Python's own arenas, which malloc's totals leave out
    assert pymalloc["pymalloc.arenas"] * 2**20 > pymalloc["pymalloc.allocated_bytes"] > 0


async def test_vllm_processes_run_the_app_s_workarounds(tiny_server: AppServer) -> None:
    """EngineCore and its worker loaded services/memory/vllm_plugins as a vLLM general plugin."""
    assert not vllm_processes_without_workarounds(tiny_server.log_path.read_text(errors="replace"))


async def test_the_app_and_vllm_s_processes_each_run_on_their_configured_malloc(
    tiny_server: AppServer,
) -> None:
    """The launcher preloaded APP_ALLOCATOR into the app; EngineCore and the worker got ENGINE_ALLOCATOR's."""
    settings = Settings.from_env(tiny_server.env)
    assert tiny_server.process is not None
    processes = [(psutil.Process(tiny_server.process.pid), settings.app_allocator)]
    processes += [(process, settings.engine_allocator) for process in engine_processes(processes[0][0])]
    assert len(processes) >= 3, "the app, EngineCore and a worker"
    for process, allocator in processes:
        maps = Path(f"/proc/{process.pid}/maps").read_text()
        mapped = [name for name in PRELOAD_LIBRARIES.values() if name in maps]
        expected = [PRELOAD_LIBRARIES[allocator]] if allocator in PRELOAD_LIBRARIES else []
        assert mapped == expected, f"{process.name()} maps {mapped}, configured {allocator}"


async def test_stop_mid_stream_aborts_the_engine_request(tiny_server: AppServer) -> None:
    async with connected(tiny_server) as (client,):
        reply = await start_long_answer(client, tiny_server)
        await client.stop()
        await tiny_server.poll(idle, timeout=ABORTED_WITHIN_SECONDS)
        assert len(reply.streamed) < LONG_ANSWER_TOKENS
        await client.update_settings(max_new_tokens=16)
        again = await client.ask("Still there?")
        assert again.final, "the session keeps working after Stop"
        assert (await tiny_server.astatus())["sessions"] >= 1


async def test_abrupt_disconnect_aborts_request_and_keeps_conversation(tiny_server: AppServer) -> None:
    async with connected(tiny_server) as (bystander,):
        assert (await bystander.ask("Hello?")).final
        sessions_before = (await tiny_server.astatus())["sessions"]
        vanishing = ChatClient(tiny_server.base_url)
        await vanishing.connect()
        await tiny_server.poll(lambda s: s["sessions"] == sessions_before + 1, timeout=WAIT_SECONDS)
        await start_long_answer(vanishing, tiny_server)
        await vanishing.drop()
        # The request ends at once; the conversation waits for the page (Chainlit's session_timeout).
        status = await tiny_server.poll(
            lambda s: idle(s) and s["sessions_awaiting_reconnect"] >= 1,
            timeout=ABORTED_WITHIN_SECONDS,
            interval=0.02,
        )
        assert status["sessions"] == sessions_before + 1
        reply = await bystander.ask("Did you notice anything?")
        assert reply.final, "other sessions don't notice"


async def test_new_message_replaces_the_running_answer(tiny_server: AppServer) -> None:
    async with connected(tiny_server) as (client,):
        first = await start_long_answer(client, tiny_server)
        await client.update_settings(max_new_tokens=16)
        second = await client.ask("Never mind: a short one.")
        assert second.final
        assert len(first.streamed) < LONG_ANSWER_TOKENS, "the first answer was cut short"
        await tiny_server.poll(idle, timeout=ABORTED_WITHIN_SECONDS)


# a server of its own: per commit, engine/test_answer_quality.py stops loops on the real engine
@pytest.mark.long
async def test_an_answer_that_loops_is_cut_back_to_what_the_history_keeps(tiny_model_dir) -> None:
    """Greedy and without the penalties, the random tiny model falls into a loop: the page replaces
    what streamed with the text before the repetition and says why it stopped."""
    env = server_env(
        MODEL=tiny_model_dir, MAX_MODEL_LEN=TINY_MAX_MODEL_LEN, MAX_NUM_BATCHED_TOKENS=4096,
        TEMPERATURE=0, FREQUENCY_PENALTY=0, REPETITION_PENALTY=1, MAX_NEW_TOKENS=LONG_ANSWER_TOKENS,
    )  # fmt: skip
    server = AppServer(env, ARTIFACTS / "logs" / "looping-server.log")
    await asyncio.to_thread(server.start)
    try:
        async with connected(server) as (client,):
            reply = await client.ask("Tell me everything you know.", timeout=300)
            assert reply.final, "the answer was finished"
            assert "started repeating itself and was stopped" in reply.final, reply.final[-300:]
            kept = reply.final.partition("⚠️")[0].rstrip()
            assert reply.streamed_text.startswith(kept) and len(kept) < len(reply.streamed_text.rstrip())
            assert len(reply.streamed) < LONG_ANSWER_TOKENS, "stopped early, not at the cap"
            await client.update_settings(max_new_tokens=16)
            after = await client.ask("A short question?")
            assert after.final and "⚠️" not in after.final
        await server.poll(idle, timeout=ABORTED_WITHIN_SECONDS)
    finally:
        assert not await asyncio.to_thread(server.stop), "engine processes outlived the server"


async def test_message_beyond_the_context_gets_a_clear_error(tiny_server: AppServer) -> None:
    async with connected(tiny_server) as (client,):
        reply = await client.ask("hello " * (TINY_MAX_MODEL_LEN + 100))
        assert "too long for this model" in reply.final
        assert "exceeds the model's maximum context length" in reply.final
        after = await client.ask("A short question?")
        assert after.final and "⚠️" not in after.final
    await tiny_server.poll(idle, timeout=WAIT_SECONDS)


async def test_trimmed_history_is_announced(tiny_server: AppServer) -> None:
    filler = "lorem ipsum dolor sit amet " * 250  # ~1,500 tokens per message
    async with connected(tiny_server) as (client,):
        for turn in range(3):
            reply = await client.ask(f"Part {turn}: {filler}")
            assert reply.final
        notices = [m for m in client.messages.values() if m.get("name") == "notice"]
        assert notices, "dropping old messages is announced"
        assert "older message(s) were left out" in notices[-1]["output"]
