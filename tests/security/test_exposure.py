"""What the server gives away without credentials: its files are private to its user whatever modes
they had before."""

from __future__ import annotations

import asyncio
import stat
from pathlib import Path

import pytest

from harness.server import AppServer
from services.config import Settings, SettingsError
from services.history.database import create_engine, ensure_data_dir


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
