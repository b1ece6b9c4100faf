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
def other_model_dir(default_model_dir: Path, tiny_model_dir: Path) -> Path:
    """A second tiny model: other random weights, untied (other answers), its own shorter context.

    Next to the tiny model, so every module that imports this fixture gets the same folder (the pool
    keys servers by their settings: another folder would be another server)."""
    folder = tiny_model_dir.parent / "tiny-other"
    return build_tiny_model(
        default_model_dir, folder, max_position_embeddings=OTHER_MODEL_CONTEXT, seed=1, tied=False
    )


@pooled(group="models")
def models_server(
    server_pool: ServerPool,
    tiny_model_dir: Path,
    other_model_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
) -> AppServer:
    def own_data_dir(server: AppServer) -> None:  # outside the app's folder, which a stop removes
        server.env["DATA_DIR"] = str(tmp_path_factory.mktemp("models-data"))

    env = server_env(
        MODELS=f"{tiny_model_dir},{other_model_dir}", MAX_MODEL_LEN=TINY_MAX_MODEL_LEN,
        MAX_NUM_BATCHED_TOKENS=4096, MAX_NEW_TOKENS=8, AUTH_MODE="password", ADMIN_USERNAME=ADMIN[0],
        ADMIN_PASSWORD=ADMIN[1], OPS_TOKEN=TINY_OPS_TOKEN, PRESETS_MAX_TEMPLATES=3, MAX_NUM_SEQS=8,
    )  # fmt: skip
    module = request.module.__name__
    return server_pool.get(env, "models-server", own_data_dir, add_alice_and_bob, user=module,
                           start_timeout=START_TIMEOUT_SECONDS)  # fmt: skip


def restart(server: AppServer) -> None:
    """Stop the server and start it again on the same database (a new app folder: a stop removes it)."""
    server.stop()
    server.env.pop("CHAINLIT_APP_ROOT")
    server.start(START_TIMEOUT_SECONDS)
