"""Maintenance on a real server: idle sessions expire, and /healthz and /livez turn 503 when the
engine dies while /readyz stays 200.

The tests share one dedicated server with a 5 s session TTL and 1 s maintenance rounds; its last
test kills the engine, so it must stay last (the maths and the process-level parts:
tests/unit/test_memory_monitor.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.chat_client import ChatClient
from harness.server import AppServer
from tests.conftest import ARTIFACTS, TINY_MAX_MODEL_LEN, server_env
from tests.system.helpers import scrape

# a server of its own: per commit, test_leaks.py's maintenance round in process
pytestmark = pytest.mark.long

SHORT_TTL_SECONDS = 5
LONG_ANSWER_TOKENS = 3000


@pytest.fixture(scope="module")
def short_ttl_server(tiny_model_dir: Path) -> Iterator[AppServer]:
    """Sessions idle for 5 s expire at the next 1 s maintenance round."""
    env = server_env(
        MODEL=tiny_model_dir, MAX_MODEL_LEN=TINY_MAX_MODEL_LEN, MAX_NUM_BATCHED_TOKENS=4096,
        MAX_NEW_TOKENS=48, SESSION_TTL_SECONDS=SHORT_TTL_SECONDS, MAINTENANCE_INTERVAL_SECONDS=1,
        MEMORY_SAMPLE_SECONDS=600,  # the sampler counts sessions, which expires them too
    )  # fmt: skip
    server = AppServer(env, ARTIFACTS / "logs" / "short-ttl-server.log").start()
    yield server
    server.stop()  # kills what the engine-kill test left behind


@pytest.mark.asyncio(loop_scope="module")
async def test_maintenance_expires_an_idle_session_and_aborts_its_request(
    short_ttl_server: AppServer,
) -> None:
    server = short_ttl_server
    expected = "maintenance: expired 1 idle session(s) (1 running request(s) aborted)"
    client = ChatClient(server.base_url)
    await client.connect()
    try:
        reply = await client.start_long_answer(LONG_ANSWER_TOKENS)
        # A running turn does not refresh its session. Nothing else may touch the store
        # now (counting sessions, as /status does, also expires them: cachetools), so
        # only the maintenance round can drop it, within TTL + one interval.
        deadline = time.monotonic() + SHORT_TTL_SECONDS + 10
        while expected not in server.log_path.read_text(errors="replace"):
            assert time.monotonic() < deadline, "no maintenance round expired the session"
            await asyncio.sleep(0.2)
        status = await server.poll(
            lambda s: s["sessions"] == s["engine_unfinished_requests"] == s["turns_in_flight"] == 0, timeout=5
        )
        assert status["sessions_dropped_total"]["expired"] == 1
        assert len(reply.streamed) < LONG_ANSWER_TOKENS, "the answer was cut short"
    finally:
        await client.close()
    metrics = await asyncio.to_thread(scrape, server)
    assert metrics["chat_maintenance_expired_sessions_total"] == 1
    assert metrics["chat_maintenance_aborted_requests_total"] == 1
    assert metrics["chat_requests_finished_total{finished_reason=abort}"] == 1


@pytest.mark.asyncio(loop_scope="module")
async def test_healthz_turns_503_when_the_engine_core_is_killed(short_ttl_server: AppServer) -> None:
    server = short_ttl_server
    code, detail = await asyncio.to_thread(server.healthz)
    assert code == 200, detail
    assert detail["engine_alive"] and all(p["running"] for p in detail["engine_processes"])
    engine_core = next(p for p in server.engine_processes if p.name() == "VLLM::EngineCore")
    engine_core.kill()
    deadline = time.monotonic() + 30
    while code == 200:
        assert time.monotonic() < deadline, f"/healthz still 200 after killing EngineCore: {detail}"
        await asyncio.sleep(0.2)
        code, detail = await asyncio.to_thread(server.healthz)
    assert code == 503
    assert "error" in detail and detail["engine_servers"]["state"] == "none"
    assert (await server.astatus())["engine_alive"] is False, "/status still answers, telling why"
    assert (await asyncio.to_thread(server.probe, "/readyz"))[0] == 200, "pages are still served"
    assert await asyncio.to_thread(server.probe, "/livez") == (
        503,
        {"status": "dead", "error": "the engine process is not running"},
    ), "a restart brings a new engine"
