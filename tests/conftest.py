"""Shared fixtures: models built once, one engine and one server per model."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.config import Settings
from services.model_prep import ensure_default_model
from tests.server import ROOT, AppServer
from tests.tiny_model import build_tiny_model

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


def pytest_configure(config: pytest.Config) -> None:
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
