"""One in-process engine on the tiny model for the engine tests of this package (test_engine.py,
test_answer_quality.py): the same settings, so one start, on the package's event loop."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest_asyncio

from services.engine.chat_engine import ChatEngine
from services.engine.lifespan import engine_lifespan
from tests.conftest import tiny_settings


@pytest_asyncio.fixture(scope="package", loop_scope="package")
async def engine(tiny_model_dir: Path) -> AsyncIterator[ChatEngine]:
    async with engine_lifespan(tiny_settings(tiny_model_dir)) as engine:
        yield engine
