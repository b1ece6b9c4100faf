"""The engine tests of this package (test_engine.py, test_answer_quality.py) use the engine of the
session's in-process runtime (tests/system/conftest.py), on the session's event loop."""

from __future__ import annotations

import pytest

from services.engine.chat_engine import ChatEngine
from services.runtime import Runtime
from tests.system.conftest import serving_of


@pytest.fixture(scope="package")
def engine(in_process_runtime: Runtime) -> ChatEngine:
    return serving_of(in_process_runtime).engine
