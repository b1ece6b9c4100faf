"""Shared fixtures: models built once, one engine and one server per model.

Every test that needs a model (and so an engine or a server) is marked `slow`
here by its fixtures: `pytest -m "not slow"` runs the pure-logic tests in seconds.
The session leaves the temp folder as it found it: engines and servers clean up.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.postgres import PostgresCluster
from harness.server import ROOT, AppServer
from harness.tiny_model import build_tiny_model
from services.config import Settings
from services.config.engine import default_cache_dir
from services.engine.model_prep import ensure_default_model

ARTIFACTS = ROOT / "artifacts"
TINY_MAX_MODEL_LEN = 4096
TINY_MAX_UPLOAD_BYTES = 2_000_000
TINY_OPS_TOKEN = "tiny-ops-token"  # the shared server's ops routes are guarded, as in production


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    return ensure_default_model(Settings.from_env({}))


@pytest.fixture(scope="session")
def tiny_model_dir(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(default_model_dir, tmp_path_factory.mktemp("models") / "tiny-llama")


def tiny_settings(model_dir: Path, **changes) -> Settings:
    """Settings for the tiny model: small budgets so tests run in seconds."""
    return Settings.from_env({}).replace(
        model=str(model_dir), max_model_len=TINY_MAX_MODEL_LEN, max_num_batched_tokens=4096, **changes
    )


def server_env(**values: object) -> dict[str, str]:
    return {key: str(value) for key, value in values.items()}


# Servers are per test module: only one engine runs at a time (vLLM binds each
# CPU worker to the same core, so two engines at once slow each other down).
@pytest.fixture(scope="module")
def tiny_server(tiny_model_dir: Path) -> Iterator[AppServer]:
    """A real `chainlit run` serving the tiny model (shared by the server tests)."""
    env = server_env(
        MODEL=tiny_model_dir, MAX_MODEL_LEN=TINY_MAX_MODEL_LEN, MAX_NUM_BATCHED_TOKENS=4096,
        MAX_NEW_TOKENS=48, MAX_SESSIONS=100, SUMMARY_MAX_TOKENS=24, SUMMARY_CHUNK_TOKENS=1024,
        MAX_UPLOAD_BYTES=TINY_MAX_UPLOAD_BYTES, OPS_TOKEN=TINY_OPS_TOKEN,
    )  # fmt: skip
    server = AppServer(env, ARTIFACTS / "logs" / "tiny-server.log").start()
    yield server
    leftovers = server.stop()
    assert not leftovers, f"engine processes outlived the server: {leftovers}"


@pytest.fixture(scope="module")
def default_server(default_model_dir: Path) -> Iterator[AppServer]:
    """A real `chainlit run` on the default model, as `scripts/run.sh` starts it."""
    server = AppServer({"MODEL": ""}, ARTIFACTS / "logs" / "default-server.log").start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresCluster]:
    """A throwaway PostgreSQL cluster (Debian's postgresql) on a free loopback port, for the session."""
    cluster = PostgresCluster().start()
    yield cluster
    cluster.remove()


# Each test session gets a temp folder of its own (TMPDIR, inherited by every server and
# engine it starts), so that concurrent sessions do not see each other's files; the
# session checks that it leaves that folder as it found it, then removes it.
SESSION_TEMP = Path(tempfile.mkdtemp(prefix="chat-tests-"))
HYPOTHESIS_HOME = "hypothesis"


def pytest_configure(config: pytest.Config) -> None:
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ["TMPDIR"] = tempfile.tempdir = str(SESSION_TEMP)
    # torch.compile's cache where the app keeps it (services/engine/local.py): kept between runs.
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(Path(default_cache_dir()) / "torchinductor"))
    # Hypothesis (the fuzz tests) keeps caches in ./.hypothesis unless told otherwise: they go with
    # the session's folder (its example database is off: tests/system/security/fuzzing.py).
    os.environ.setdefault("HYPOTHESIS_STORAGE_DIRECTORY", str(SESSION_TEMP / HYPOTHESIS_HOME))


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(SESSION_TEMP, ignore_errors=True)


MODEL_FIXTURES = {"default_model_dir", "tiny_model_dir"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark `slow` every test that needs a model: it starts an engine or a server."""
    for item in items:
        if MODEL_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


# pytest's own tmp_path root, and torch's compile cache: torch writes part of it under
# tempfile.gettempdir() whatever TORCHINDUCTOR_CACHE_DIR says (torch/_inductor/cache.py,
# codecache.py call default_cache_dir() directly). Both go with the session's folder.
NOT_OURS = ("pytest-of-", "torchinductor_", HYPOTHESIS_HOME)


@pytest.fixture(scope="session", autouse=True)
def temp_folder_left_as_found() -> Iterator[None]:
    """Fail the session if it leaves files in its temp folder (vLLM sockets, RPC folders, uploads)."""
    yield
    left = sorted(name for name in os.listdir(SESSION_TEMP) if not name.startswith(NOT_OURS))
    assert not left, f"the tests left these in the temp folder: {left}"
