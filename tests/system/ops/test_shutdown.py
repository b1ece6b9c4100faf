"""Stopping the app: SIGINT stops vLLM's engine processes, and after a SIGKILL of the app (no shutdown
hook runs) the orphan guard stops them. Each test kills a server of its own.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.server import AppServer, start_together
from tests.conftest import ARTIFACTS, TINY_MAX_MODEL_LEN, server_env

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest.fixture(scope="module")
def doomed(tiny_model_dir: Path) -> Iterator[dict[str, AppServer]]:
    """The two servers these tests kill, started together: how fast they start is not what the tests
    prove, and the starts overlap (imports, engine start, warm-up) instead of following each other."""
    env = server_env(MODEL=tiny_model_dir, MAX_MODEL_LEN=TINY_MAX_MODEL_LEN, MAX_NUM_BATCHED_TOKENS=4096)
    servers = {
        name: AppServer(dict(env), ARTIFACTS / "logs" / f"{name}-server.log")
        for name in ("sigint", "sigkill")
    }
    start_together(*servers.values())
    yield servers
    for server in servers.values():
        server.stop()  # nothing left to stop unless a test failed before its signal


async def test_sigint_stops_the_engine_processes(doomed: dict[str, AppServer]) -> None:
    server = doomed["sigint"]
    assert server.engine_processes, "vLLM runs its engine in child processes"
    leftovers = await asyncio.to_thread(server.stop, signal.SIGINT)
    assert leftovers == []
    assert server.process.returncode is not None


async def test_sigkill_of_the_app_leaves_no_engine_process(doomed: dict[str, AppServer]) -> None:
    server = doomed["sigkill"]
    engine = [p for p in server.engine_processes if p.name().startswith("VLLM::")]
    assert len(engine) >= 2, "EngineCore and its worker"
    leftovers = await asyncio.to_thread(server.stop, signal.SIGKILL)  # no shutdown hook runs
    assert leftovers == [], "the orphan guard stopped EngineCore and the worker"
