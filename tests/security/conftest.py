"""Real `chainlit run` servers (tiny model, SQLite) shared by the attack suite, one per distinct
settings: every attack runs against the real routes and the real socket.

- `target`: password sign-in with people ALICE and BOB and the administrator ADMIN, GitHub sign-in
  too (against `fake_github`, with an allowlist), uvicorn trusting every X-Forwarded-For
  (FORWARDED_ALLOW_IPS=*, as containers are often run);
- `local_target`: nothing configured, on loopback: the one local user (the default install);
- `proxied_target`: header sign-in behind an auth proxy at PROXY_ADDRESS, uvicorn trusting every
  X-Forwarded-For.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.fake_github import FakeGitHub
from harness.server import AppServer
from tests.conftest import ARTIFACTS, TINY_MAX_MODEL_LEN, server_env
from tests.test_people import ADMIN, ALICE, BOB, accounts

__all__ = ["ADMIN", "ALICE", "BOB", "accounts"]

# A change made by the accounts command (another process) reaches the server's checks this late at
# most; the default is 30 s, shortened here so the attacks on ended sign-ins run quickly.
SIGN_IN_CHECK_SECONDS = 1

GITHUB_ORG = "acme"  # members of this GitHub organisation may sign in
ALLOWED_DOMAIN = "example.com"  # and people with a verified e-mail address here
ALLOWED_GITHUB_USER = "github:carol-gh"  # and this one GitHub user
PROXY_ADDRESS = "127.0.0.2"  # the auth proxy of `proxied_target` (a loopback address of its own)
PROXY_USER_HEADER = "X-Auth-User"


def tiny_env(model_dir: Path, data_dir: Path, **values: object) -> dict[str, str]:
    return server_env(
        MODEL=model_dir, MAX_MODEL_LEN=TINY_MAX_MODEL_LEN, MAX_NUM_BATCHED_TOKENS=4096, MAX_NEW_TOKENS=8,
        DATA_DIR=data_dir, **values,
    )  # fmt: skip


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
def fake_github() -> Iterator[FakeGitHub]:
    github = FakeGitHub().start()
    yield github
    github.stop()


@pytest.fixture(scope="package")
def target(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory, fake_github: FakeGitHub
) -> Iterator[AppServer]:
    data_dir = tmp_path_factory.mktemp("attacked-data")
    loosen(data_dir)
    env = tiny_env(
        tiny_model_dir, data_dir, AUTH_MODE="password", ADMIN_USERNAME=ADMIN[0],
        ADMIN_PASSWORD=ADMIN[1], FORWARDED_ALLOW_IPS="*", SIGN_IN_CHECK_SECONDS=SIGN_IN_CHECK_SECONDS,
        OAUTH_ALLOWED_ORGS=GITHUB_ORG, OAUTH_ALLOWED_DOMAINS=ALLOWED_DOMAIN,
        OAUTH_ALLOWED_USERS=ALLOWED_GITHUB_USER, OPS_TOKEN=OPS_TOKEN, **fake_github.env(),
    )  # fmt: skip
    server = AppServer(env, ARTIFACTS / "logs" / "security-server.log").start()
    for name, password in (ALICE, BOB):
        accounts(data_dir, "add", name, stdin=password + "\n")
    yield server
    assert not server.stop(), "engine processes outlived the server"


@pytest.fixture(scope="package")
def local_target(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AppServer]:
    """The default install: no sign-in configured, bound to 127.0.0.1 (the local user)."""
    env = tiny_env(tiny_model_dir, tmp_path_factory.mktemp("local-data"))
    server = AppServer(env, ARTIFACTS / "logs" / "security-local-server.log").start()
    yield server
    assert not server.stop(), "engine processes outlived the server"


@pytest.fixture(scope="package")
def proxied_target(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AppServer]:
    """Header sign-in: only PROXY_ADDRESS may name the user; uvicorn trusts every X-Forwarded-For."""
    env = tiny_env(
        tiny_model_dir, tmp_path_factory.mktemp("proxied-data"), AUTH_MODE="header",
        AUTH_HEADER=PROXY_USER_HEADER, AUTH_PROXY_ADDRESSES=PROXY_ADDRESS, FORWARDED_ALLOW_IPS="*",
    )  # fmt: skip
    server = AppServer(env, ARTIFACTS / "logs" / "security-proxied-server.log").start()
    yield server
    assert not server.stop(), "engine processes outlived the server"
