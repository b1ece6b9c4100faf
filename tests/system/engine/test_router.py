"""ENGINE_ROUTER: the app chats through vLLM's router (`vllm-router`) in front of two `vllm serve`
servers (tiny model): the router routes, each conversation stays on one server, admission reads the
servers' load, and a server or the router going away costs one answer, not the service."""

from __future__ import annotations

import asyncio
import signal
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.chat_client import ChatClient
from harness.router import VllmRouter
from harness.server import AppServer, VllmServer
from tests.conftest import ARTIFACTS, TINY_MAX_MODEL_LEN, server_env

NOT_AVAILABLE = "The model is not available right now"
CONVERSATIONS = 12  # all of them on one server by chance: 2 in 2**12
in_loop = pytest.mark.asyncio(loop_scope="module")


def answered(server: VllmServer) -> float:
    """Requests the server has finished, from its own Prometheus metrics."""
    with urllib.request.urlopen(f"{server.url}/metrics", timeout=5) as response:
        lines = response.read().decode().splitlines()
    finished = [line for line in lines if line.startswith("vllm:request_success_total{")]
    return sum(float(line.rsplit(" ", 1)[1]) for line in finished)


@pytest.fixture(scope="module")
def vllm_servers(tiny_model_dir: Path) -> Iterator[list[VllmServer]]:
    logs = ARTIFACTS / "logs"
    servers = [VllmServer(tiny_model_dir, logs / f"router-vllm-{i}.log", TINY_MAX_MODEL_LEN) for i in (1, 2)]
    try:
        for server in servers:
            server.start()
        yield servers
    finally:
        for server in servers:
            server.stop()


@pytest.fixture(scope="module")
def router(vllm_servers: list[VllmServer]) -> Iterator[VllmRouter]:
    router = VllmRouter([s.url for s in vllm_servers], ARTIFACTS / "logs" / "vllm-router.log").start()
    yield router
    router.stop()


@pytest.fixture(scope="module")
def routed_app(router: VllmRouter, tiny_model_dir: Path) -> Iterator[AppServer]:
    env = server_env(ENGINE_URLS=router.url, ENGINE_ROUTER=True, MODEL=tiny_model_dir, MAX_NEW_TOKENS=16)
    app = AppServer(env, ARTIFACTS / "logs" / "routed-app.log").start()
    yield app
    app.stop()


@in_loop
async def test_each_conversation_stays_on_one_server_and_conversations_spread(
    routed_app: AppServer, vllm_servers: list[VllmServer]
) -> None:
    homes = []
    for index in range(CONVERSATIONS):
        client = ChatClient(routed_app.base_url)
        await client.connect()
        try:
            before = [answered(s) for s in vllm_servers]
            for turn in range(3):
                reply = await client.ask(f"Turn {turn} of conversation {index}?")
                assert reply.final, reply
            served = [answered(s) - b for s, b in zip(vllm_servers, before, strict=True)]
        finally:
            await client.close()
        assert sorted(served) == [0, 3], f"conversation {index} moved between servers: {served}"
        homes.append(served.index(3))
    assert set(homes) == {0, 1}, f"every conversation went to one server: {homes}"


@in_loop
async def test_admission_reads_the_load_of_the_servers_behind_the_router(routed_app: AppServer) -> None:
    client = ChatClient(routed_app.base_url)
    await client.connect()
    try:
        reply = await client.start_long_answer(1500)
        status = await routed_app.poll(lambda s: s["engine_load"]["running"] >= 1, timeout=15)
        assert status["engine_unfinished_requests"] == 1
        await client.stop()
        await asyncio.wait_for(reply.done.wait(), 30)
        await routed_app.poll(lambda s: s["engine_load"]["running"] == 0, timeout=15)
    finally:
        await client.close()


@in_loop
async def test_the_router_restarted_costs_the_turns_meanwhile_only(
    routed_app: AppServer, router: VllmRouter
) -> None:
    client = ChatClient(routed_app.base_url)
    await client.connect()
    try:
        router.stop()
        refused = await client.ask("Is the router there?", timeout=60)
        assert refused.final is not None and NOT_AVAILABLE in refused.final, refused.final
        router.start()
        again = await client.ask("And now?", timeout=60)
        assert again.final and NOT_AVAILABLE not in again.final, again.final
    finally:
        await client.close()


@in_loop
async def test_a_server_lost_mid_answer_keeps_the_partial_answer_and_the_next_turn_works(
    routed_app: AppServer, vllm_servers: list[VllmServer]
) -> None:
    client = ChatClient(routed_app.base_url)
    await client.connect()
    try:
        before = [answered(s) for s in vllm_servers]
        assert (await client.ask("Where do I live?")).final
        home = next(i for i, s in enumerate(vllm_servers) if answered(s) > before[i])
        reply = await client.start_long_answer(3000)
        await client.wait_first_token(reply)
        vllm_servers[home].stop(signal.SIGKILL)  # last test of the module: gone for good
        await asyncio.wait_for(reply.done.wait(), 60)
        assert reply.final is not None and NOT_AVAILABLE in reply.final, reply.final
        assert reply.streamed_text and reply.final.startswith(reply.streamed_text), "the partial answer stays"
        again = await client.ask("Still there?", timeout=60)
        assert again.final and NOT_AVAILABLE not in again.final, again.final
    finally:
        await client.close()
    status = routed_app.status()
    assert status["engine_unfinished_requests"] == 0 and status["turns_in_flight"] == 0
