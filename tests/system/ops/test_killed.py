"""After a SIGKILL of the app no shutdown hook runs: the orphan guard stops vLLM's engine processes.
The test kills the default-model server once its other tests are done with it (LAST_ON_ITS_SERVER).
"""

from __future__ import annotations

import asyncio
import signal

import pytest

from harness.server import AppServer
from tests.conftest import ServerPool

pytestmark = pytest.mark.asyncio(loop_scope="module")

LAST_ON_ITS_SERVER = True


async def test_sigkill_of_the_app_leaves_no_engine_process(
    default_server: AppServer, server_pool: ServerPool
) -> None:
    engine = [p for p in default_server.engine_processes if p.name().startswith("VLLM::")]
    assert len(engine) >= 2, "EngineCore and its worker"
    leftovers = await asyncio.to_thread(server_pool.stop, default_server, signal.SIGKILL)  # no hook runs
    assert leftovers == [], "the orphan guard stopped EngineCore and the worker"
