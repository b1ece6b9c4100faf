"""Stopping the app: SIGINT stops vLLM's engine processes. The test stops the tiny server once its
other tests are done with it (LAST_ON_ITS_SERVER); a later user would get a new one.
"""

from __future__ import annotations

import asyncio
import signal

import pytest

from harness.server import AppServer
from tests.conftest import ServerPool

pytestmark = pytest.mark.asyncio(loop_scope="module")

LAST_ON_ITS_SERVER = True


async def test_sigint_stops_the_engine_processes(tiny_server: AppServer, server_pool: ServerPool) -> None:
    assert tiny_server.engine_processes, "vLLM runs its engine in child processes"
    leftovers = await asyncio.to_thread(server_pool.stop, tiny_server, signal.SIGINT)
    assert leftovers == []
    assert tiny_server.process.returncode is not None
