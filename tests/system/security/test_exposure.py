"""What the server gives away without credentials: its files are private to its user whatever modes
they had before, anonymous probes (/healthz, /readyz, /livez) say only their state, and a server
other machines can reach does not start with its operators' routes open."""

from __future__ import annotations

import asyncio
import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from harness.server import ROOT, AppServer
from services.config import Settings, SettingsError
from services.history.database import create_engine, ensure_data_dir
from tests.system.security.conftest import OPS_TOKEN

in_loop = pytest.mark.asyncio(loop_scope="package")


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_data_dir_and_database_files_are_private(target: AppServer) -> None:
    """The fixture left DATA_DIR 0755 and chat.db, its -wal and -shm and auth-secret 0644 before the
    start, as an older version or a careless copy would."""
    data_dir = Path(target.env["DATA_DIR"])
    assert mode(data_dir) == 0o700, oct(mode(data_dir))
    files = {path.name: mode(path) for path in data_dir.iterdir()}
    assert {"chat.db", "chat.db-wal", "chat.db-shm", "auth-secret"} <= files.keys(), files
    assert all(value == 0o600 for value in files.values()), {
        name: oct(value) for name, value in files.items()
    }


@in_loop
async def test_anonymous_probes_say_only_the_state(target: AppServer) -> None:
    async with httpx.AsyncClient(base_url=target.base_url, timeout=30) as http:
        for path, state, shown in (
            ("/healthz", "ok", "engine_processes"),
            ("/readyz", "ready", "database"),
            ("/livez", "alive", "status"),
        ):
            anonymous = await http.get(path)
            wrong = await http.get(path, headers={"Authorization": "Bearer wrong"})
            operator = await http.get(path, headers={"Authorization": f"Bearer {OPS_TOKEN}"})
            for response in (anonymous, wrong):
                assert response.status_code == 200 and response.json() == {"status": state}, response.text
            detail = operator.json()
            assert operator.status_code == 200 and detail["status"] == state and shown in detail, detail


def test_a_public_address_without_ops_token_refuses_to_start(tmp_path: Path) -> None:
    env = {**os.environ, "DATA_DIR": str(tmp_path), "CHAINLIT_APP_ROOT": str(ROOT), "AUTH_MODE": "password"}
    for name in ("OPS_TOKEN", "CHAINLIT_AUTH_SECRET"):
        env.pop(name, None)
    launch = [sys.executable, "-m", "services.web.launch", "app.py", "--headless", "--host", "0.0.0.0"]
    with socket.socket() as taken:  # were it to start, it would stop at its bind, not serve on
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        result = subprocess.run([*launch, "--port", port], cwd=ROOT, env=env, capture_output=True, text=True,
                                timeout=300)  # fmt: skip
    assert result.returncode != 0
    assert "Refusing to start" in result.stderr and "OPS_TOKEN" in result.stderr, result.stderr[-2000:]
    assert not any(tmp_path.iterdir()), "nothing was created before refusing"


def test_the_docker_image_is_told_to_pass_an_ops_token() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    run_line = next(line for line in dockerfile.splitlines() if line.startswith("# Run:"))
    assert "OPS_TOKEN" in run_line, run_line


def test_a_database_outside_data_dir_is_private_too(tmp_path: Path) -> None:
    database = tmp_path / "elsewhere.db"
    database.touch(0o644)
    database.chmod(0o644)
    engine = create_engine(Settings.from_env({"DATABASE_URL": f"sqlite:///{database}"}))
    asyncio.run(engine.dispose())
    assert mode(database) == 0o600


def test_a_shared_folder_is_refused_as_data_dir(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # like /tmp: others may create files in it
    with pytest.raises(SettingsError, match="shared folder"):
        ensure_data_dir(Settings.from_env({"DATA_DIR": str(shared)}))
    assert mode(shared) == 0o1777, "left as it was"


@in_loop
async def test_the_api_documentation_is_off(target: AppServer) -> None:
    """FastAPI's schema and documentation pages told anyone, without sign-in, every route and its
    parameters (Swagger UI loading its script from a CDN); their paths are now the chat page's."""
    async with httpx.AsyncClient(base_url=target.base_url, timeout=30) as http:
        page = (await http.get("/no/such/page")).text
        for path in ("/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"):
            answer = await http.get(path)
            assert answer.text == page and '"openapi"' not in answer.text, (path, answer.text[:300])
            assert "swagger" not in answer.text.lower() and "redoc" not in answer.text.lower(), path
