"""Stopping the app: SIGINT stops vLLM's engine processes, and after a SIGKILL of the app (no shutdown
hook runs) the orphan guard stops them. Each test kills a server of its own.
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest

from harness.server import AppServer
from tests.conftest import ARTIFACTS, TINY_MAX_MODEL_LEN, server_env

pytestmark = pytest.mark.asyncio(loop_scope="module")


async def test_sigint_stops_the_engine_processes(tiny_model_dir: Path) -> None:
    env = server_env(MODEL=tiny_model_dir, MAX_MODEL_LEN=TINY_MAX_MODEL_LEN, MAX_NUM_BATCHED_TOKENS=4096)
    server = AppServer(env, ARTIFACTS / "logs" / "sigint-server.log")
    await asyncio.to_thread(server.start)
    assert server.engine_processes, "vLLM runs its engine in child processes"
    leftovers = await asyncio.to_thread(server.stop, signal.SIGINT)
    assert leftovers == []
    assert server.process.returncode is not None


async def test_sigkill_of_the_app_leaves_no_engine_process(tiny_model_dir: Path) -> None:
    env = server_env(MODEL=tiny_model_dir, MAX_MODEL_LEN=TINY_MAX_MODEL_LEN, MAX_NUM_BATCHED_TOKENS=4096)
    server = AppServer(env, ARTIFACTS / "logs" / "sigkill-server.log")
    await asyncio.to_thread(server.start)
    engine = [p for p in server.engine_processes if p.name().startswith("VLLM::")]
    assert len(engine) >= 2, "EngineCore and its worker"
    leftovers = await asyncio.to_thread(server.stop, signal.SIGKILL)  # no shutdown hook runs
    assert leftovers == [], "the orphan guard stopped EngineCore and the worker"
