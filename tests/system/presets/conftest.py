"""The two-model server the presets and model-choice tests share (socket.io, HTTP and browser tests):
the tiny model and a second tiny model with other weights and a shorter context, both served in this
process (MODELS), password sign-in with ADMIN, ALICE and BOB."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.server import AppServer
from harness.tiny_model import build_tiny_model
from tests.conftest import TINY_MAX_MODEL_LEN, TINY_OPS_TOKEN, ServerPool, pooled, server_env
from tests.system.conftest import ADMIN, add_alice_and_bob

OTHER_MODEL_CONTEXT = 2048  # the second model's own context, shorter than MAX_MODEL_LEN
# Two engines start and warm up one after the other: twice a one-model server's time, and much more
# on a machine other engines share.
START_TIMEOUT_SECONDS = 1200


@pytest.fixture(scope="session")
def other_model_dir(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A second tiny model: other random weights, untied (other answers), its own shorter context."""
    folder = tmp_path_factory.mktemp("models") / "tiny-other"
    return build_tiny_model(
        default_model_dir, folder, max_position_embeddings=OTHER_MODEL_CONTEXT, seed=1, tied=False
    )


@pooled(group="models")
def models_server(
    server_pool: ServerPool, tiny_model_dir: Path, other_model_dir: Path, request: pytest.FixtureRequest
) -> AppServer:
    env = server_env(
        MODELS=f"{tiny_model_dir},{other_model_dir}", MAX_MODEL_LEN=TINY_MAX_MODEL_LEN,
        MAX_NUM_BATCHED_TOKENS=4096, MAX_NEW_TOKENS=8, AUTH_MODE="password", ADMIN_USERNAME=ADMIN[0],
        ADMIN_PASSWORD=ADMIN[1], OPS_TOKEN=TINY_OPS_TOKEN, PRESETS_MAX_TEMPLATES=3, MAX_NUM_SEQS=8,
    )  # fmt: skip
    return server_pool.get(env, "models-server", after_start=add_alice_and_bob, user=request.module.__name__,
                           start_timeout=START_TIMEOUT_SECONDS)  # fmt: skip
