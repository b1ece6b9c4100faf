"""Two app replicas sharing one PostgreSQL (Debian's, a throwaway cluster), for this package: the
quota tests (test_quotas_postgres.py, which stops replica B in its last test, so it runs last) and
the per-person limits counted across replicas (test_limits_across_replicas.py). Each test uses
people of its own, so the small budget and the limits of one never reach another; `command` runs the
operators' commands on their database."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.postgres import PostgresCluster
from harness.server import ROOT, AppServer
from tests.conftest import ARTIFACTS, TINY_MAX_MODEL_LEN, server_env

ADMIN = ("admin", "admin-password-1")
DAY_BUDGET = 300  # tokens: one long turn fits, a second does not
FLUSH_SECONDS, REFRESH_SECONDS = 1, 2


@pytest.fixture(scope="package")
def database_url(postgres: PostgresCluster) -> str:
    return postgres.create_database("usage")


@pytest.fixture(scope="package")
def replicas(tiny_model_dir: Path, database_url: str) -> Iterator[tuple[AppServer, AppServer]]:
    env = server_env(
        MODEL=tiny_model_dir, MAX_MODEL_LEN=TINY_MAX_MODEL_LEN, MAX_NUM_BATCHED_TOKENS=4096,
        MAX_NEW_TOKENS=8, AUTH_MODE="password", ADMIN_USERNAME=ADMIN[0], ADMIN_PASSWORD=ADMIN[1],
        DATABASE_URL=database_url, CHAINLIT_AUTH_SECRET=secrets.token_urlsafe(48),
        QUOTA_TOKENS_PER_DAY_USER=DAY_BUDGET, USAGE_REFRESH_SECONDS=REFRESH_SECONDS,
    )  # fmt: skip
    servers: list[AppServer] = []
    try:
        for name, flush in (("a", FLUSH_SECONDS), ("b", 3600)):
            server = AppServer(
                {**env, "USAGE_FLUSH_SECONDS": str(flush)}, ARTIFACTS / "logs" / f"usage-{name}.log"
            )
            servers.append(server.start(timeout=900))  # a busy machine starts engines slowly
        yield servers[0], servers[1]
    finally:
        for server in servers:
            server.stop()


def command(database_url: str, module: str, *args: str, stdin: str = "") -> str:
    """`python -m services.<module> ...` on the replicas' database, as an operator runs it."""
    env = {**os.environ, "DATABASE_URL": database_url}
    done = subprocess.run([sys.executable, "-m", f"services.{module}", *args], cwd=ROOT, env=env, input=stdin,
                          capture_output=True, text=True, timeout=300, check=True)  # fmt: skip
    return done.stdout
