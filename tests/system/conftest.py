"""The servers and fixtures that the system tests of several packages share.

The password-sign-in server that the people tests (accounts/) and the attack suite (security/)
share, one configuration from the session's server pool: password sign-in with the administrator
ADMIN and the people ALICE and BOB, GitHub sign-in too (against `fake_github`, with an allowlist),
uvicorn trusting every X-Forwarded-For (FORWARDED_ALLOW_IPS=*, as containers are often run), the
operators' routes guarded by OPS_TOKEN, share links on (SHARING=true: Chainlit's own share routes stay
refused), and a DATA_DIR left loose before the start (the server
must tighten it). Each test that signs in wrongly, ends sign-ins or adds people uses accounts and
client addresses of its own, so the tests stay independent on the one server.

The two-model server of the presets and model-choice tests (presets/, browser/): the tiny model and a
second tiny model with other weights and a shorter context, both served in this process (MODELS),
password sign-in with ADMIN, ALICE and BOB. The app's runtime in this process (engine/, memory/), and
a browser page (browser/, and a test elsewhere that watches what a person sees)."""

from __future__ import annotations

import gc
import os
import secrets
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio
from playwright.sync_api import Page, sync_playwright

from harness.browser import browser_page
from harness.fake_github import FakeGitHub
from harness.server import ROOT, AppServer
from harness.tiny_model import build_tiny_model
from services.engine import lifespan as engine_lifespan
from services.runtime import Runtime, Serving
from tests.conftest import TINY_MAX_MODEL_LEN, TINY_OPS_TOKEN, ServerPool, pooled, server_env, tiny_settings

ADMIN = ("admin", "admin-password-1")
ALICE = ("alice", "alice-password-1")
BOB = ("bob", "bobs-password-11")

# How long a server trusts what a directory said of a signed-in person (LDAP only: accounts in the
# database are read at every check); the default is 30 s, shortened so such tests run quickly.
SIGN_IN_CHECK_SECONDS = 1

GITHUB_ORG = "acme"  # members of this GitHub organisation may sign in
ALLOWED_DOMAIN = "example.com"  # and people with a verified e-mail address here
ALLOWED_GITHUB_USER = "github:carol-gh"  # and this one GitHub user
OPS_TOKEN = "security-ops-token"  # the operators' routes are guarded, as they must be in production


def accounts(data_dir: Path, *args: str, stdin: str = "") -> subprocess.CompletedProcess:
    """`python -m services.accounts ...` on the server's database, as an operator runs it."""
    env = {**os.environ, "DATA_DIR": str(data_dir)}
    return subprocess.run([sys.executable, "-m", "services.accounts", *args], cwd=ROOT, env=env, input=stdin,
                          capture_output=True, text=True, timeout=60, check=True)  # fmt: skip


def tiny_env(model_dir: Path, **values: object) -> dict[str, str]:
    return server_env(
        MODEL=model_dir, MAX_MODEL_LEN=TINY_MAX_MODEL_LEN, MAX_NUM_BATCHED_TOKENS=4096, MAX_NEW_TOKENS=8,
        **values,
    )  # fmt: skip


def loosen(data_dir: Path) -> None:
    """DATA_DIR and its files readable by everyone, as an older version or a careless copy left them."""
    data_dir.chmod(0o755)
    for name in ("chat.db", "chat.db-wal", "chat.db-shm"):
        (data_dir / name).touch(0o644)
    (data_dir / "auth-secret").write_text(secrets.token_urlsafe(48))
    for path in data_dir.iterdir():
        path.chmod(0o644)


@pytest.fixture(scope="session")
def fake_github() -> Iterator[FakeGitHub]:
    """For the session: its address is part of the password server's settings, which the pool keys
    servers by."""
    github = FakeGitHub().start()
    yield github
    github.stop()


def add_alice_and_bob(server: AppServer) -> None:
    for name, password in (ALICE, BOB):
        accounts(Path(server.env["DATA_DIR"]), "add", name, stdin=password + "\n")


def shared_password_server(
    server_pool: ServerPool, model_dir: Path, tmp_path_factory: pytest.TempPathFactory, github: FakeGitHub
) -> AppServer:
    """The one running password server (started on first use)."""

    def loosened_data_dir(server: AppServer) -> None:
        data_dir = tmp_path_factory.mktemp("password-data")
        loosen(data_dir)
        server.env["DATA_DIR"] = str(data_dir)

    env = tiny_env(
        model_dir, AUTH_MODE="password", ADMIN_USERNAME=ADMIN[0], ADMIN_PASSWORD=ADMIN[1],
        FORWARDED_ALLOW_IPS="*", SIGN_IN_CHECK_SECONDS=SIGN_IN_CHECK_SECONDS, OAUTH_ALLOWED_ORGS=GITHUB_ORG,
        OAUTH_ALLOWED_DOMAINS=ALLOWED_DOMAIN, OAUTH_ALLOWED_USERS=ALLOWED_GITHUB_USER, OPS_TOKEN=OPS_TOKEN,
        SHARING="true", **github.env(),
    )  # fmt: skip
    return server_pool.get(env, "password-server", loosened_data_dir, add_alice_and_bob)


@pooled(group="password")
def password_server(
    server_pool: ServerPool,
    tiny_model_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
    fake_github: FakeGitHub,
) -> AppServer:
    return shared_password_server(server_pool, tiny_model_dir, tmp_path_factory, fake_github)


OTHER_MODEL_CONTEXT = 2048  # the two-model server's second model's own context, shorter than MAX_MODEL_LEN
# Two engines start and warm up one after the other: twice a one-model server's time, and much more
# on a machine other engines share.
MODELS_START_TIMEOUT_SECONDS = 1200


@pytest.fixture(scope="session")
def other_model_dir(default_model_dir: Path, tiny_model_dir: Path) -> Path:
    """A second tiny model: other random weights, untied (other answers), its own shorter context.

    Next to the tiny model, so that it is one folder for the session (the pool keys servers by
    their settings: another folder would be another server)."""
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
    """The two-model server (module docstring)."""

    def own_data_dir(server: AppServer) -> None:  # outside the app's folder, which a stop removes
        server.env["DATA_DIR"] = str(tmp_path_factory.mktemp("models-data"))

    env = server_env(
        MODELS=f"{tiny_model_dir},{other_model_dir}", MAX_MODEL_LEN=TINY_MAX_MODEL_LEN,
        MAX_NUM_BATCHED_TOKENS=4096, MAX_NEW_TOKENS=8, AUTH_MODE="password", ADMIN_USERNAME=ADMIN[0],
        ADMIN_PASSWORD=ADMIN[1], OPS_TOKEN=TINY_OPS_TOKEN, PRESETS_MAX_TEMPLATES=3, MAX_NUM_SEQS=8,
    )  # fmt: skip
    module = request.module.__name__
    return server_pool.get(env, "models-server", own_data_dir, add_alice_and_bob, user=module,
                           start_timeout=MODELS_START_TIMEOUT_SECONDS)  # fmt: skip


# The in-process runtime's settings that the tests of the session layer count on.
IN_PROCESS_MAX_HISTORY = 6
IN_PROCESS_MAX_SESSIONS = 64


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def in_process_runtime(tiny_model_dir: Path) -> AsyncIterator[Runtime]:
    """The app's composition root in this process on the tiny model, started once for every test
    that drives the engine or the session layer directly (engine/, memory/test_leaks.py), on the
    session's event loop: one engine start for all of them. Its settings are the leak tests' (short
    answers, a small history and session cache, memory sampled every 0.5 s)."""
    settings = tiny_settings(
        tiny_model_dir,
        max_new_tokens=6,
        max_history_messages=IN_PROCESS_MAX_HISTORY,
        max_sessions=IN_PROCESS_MAX_SESSIONS,
        memory_sample_seconds=0.5,
    )
    runtime = Runtime(settings)
    with pytest.MonkeyPatch.context() as patch:
        # The answer-ids cache is bounded (ANSWER_TOKEN_CACHE_TOKENS, ~1 MB, full after ~2,000 of the
        # leak tests' 4-token answers); sized to fill within their churn's warm-up, so its traced
        # halves see it full.
        patch.setattr(engine_lifespan, "ANSWER_TOKEN_CACHE_TOKENS", 16_384)
        await runtime.start()
    engine = serving_of(runtime).engine
    yield runtime
    await runtime.stop()
    assert engine._on_finish == [], "stop unregisters the metrics listener"
    assert gc.get_freeze_count() == 0, "stop unfreezes the start-up heap"


def serving_of(runtime: Runtime) -> Serving:
    """The running parts of a started runtime."""
    serving = runtime.running()
    assert serving is not None
    return serving


@pytest.fixture
def page() -> Iterator[Page]:
    """A fresh page in headless Chromium, for one test (tests/system/browser/, and a test elsewhere
    that watches what a person sees)."""
    with sync_playwright() as playwright:
        browser, page = browser_page(playwright)
        yield page
        browser.close()
