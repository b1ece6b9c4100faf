"""One real `chainlit run` (tiny model, SQLite, password sign-in) with two people on it, shared by
the attack suite: every attack runs as a signed-in person, or as nobody, against the real routes
and the real socket."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.server import AppServer
from tests.conftest import ARTIFACTS, TINY_MAX_MODEL_LEN, server_env
from tests.test_people import ADMIN, ALICE, BOB, accounts

__all__ = ["ALICE", "BOB"]

OPS_TOKEN = "security-ops-token"  # the operators' routes are guarded, as they must be in production


def loosen(data_dir: Path) -> None:
    """DATA_DIR and its files readable by everyone, as an older version or a careless copy left them."""
    data_dir.chmod(0o755)
    for name in ("chat.db", "chat.db-wal", "chat.db-shm"):
        (data_dir / name).touch(0o644)
    (data_dir / "auth-secret").write_text(secrets.token_urlsafe(48))
    for path in data_dir.iterdir():
        path.chmod(0o644)


@pytest.fixture(scope="package")
def target(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AppServer]:
    data_dir = tmp_path_factory.mktemp("attacked-data")
    loosen(data_dir)
    env = server_env(
        MODEL=tiny_model_dir, MAX_MODEL_LEN=TINY_MAX_MODEL_LEN, MAX_NUM_BATCHED_TOKENS=4096,
        MAX_NEW_TOKENS=8, AUTH_MODE="password", ADMIN_USERNAME=ADMIN[0], ADMIN_PASSWORD=ADMIN[1],
        DATA_DIR=data_dir, OPS_TOKEN=OPS_TOKEN,
    )  # fmt: skip
    server = AppServer(env, ARTIFACTS / "logs" / "security-server.log").start()
    for name, password in (ALICE, BOB):
        accounts(data_dir, "add", name, stdin=password + "\n")
    yield server
    assert not server.stop(), "engine processes outlived the server"
