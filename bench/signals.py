"""Run a benchmark so that SIGTERM/SIGINT shut its engine down instead of orphaning vLLM's processes."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run_until_signalled(main: Coroutine[Any, Any, T]) -> T:
    """asyncio.run(main), but SIGTERM/SIGINT cancel it, so `async with engine_lifespan` exits cleanly.

    Without this, SIGTERM (e.g. from `timeout`) kills the script at once and
    vLLM's worker process lives on, re-parented to init, burning a core.
    """

    async def guarded() -> T:
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, task.cancel)
        return await main

    return asyncio.run(guarded())
