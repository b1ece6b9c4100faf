"""CHAINLIT_AUTH_SECRET: the key that signs sign-in cookies, generated once and kept in DATA_DIR (0600).

Changing it signs everyone out, so it is created once and reused. Replicas on several machines
must share it: set CHAINLIT_AUTH_SECRET on each, or share DATA_DIR.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

SECRET_FILE_NAME = "auth-secret"
ENV_NAME = "CHAINLIT_AUTH_SECRET"


def load_or_create_secret(data_dir: Path, name: str = SECRET_FILE_NAME, size_bytes: int = 48) -> str:
    """The secret kept in `data_dir/name`, created (atomically, mode 0600) on first use."""
    path = data_dir / name
    if not path.exists():
        temporary = data_dir / f".{name}.{os.getpid()}"
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as file:
            file.write(secrets.token_urlsafe(size_bytes))
        try:
            os.link(temporary, path)  # fails if another process made one first: theirs wins
        except FileExistsError:
            pass
        finally:
            with contextlib.suppress(FileNotFoundError):
                temporary.unlink()
    os.chmod(path, 0o600)
    secret = path.read_text().strip()
    if len(secret) < 32:
        raise RuntimeError(f"{path} holds no usable secret; delete it to make a new one")
    return secret


def ensure_auth_secret(data_dir: Path) -> str:
    """CHAINLIT_AUTH_SECRET when set; else the kept one, exported for Chainlit. Returns where it came from."""
    if os.environ.get(ENV_NAME):
        return "environment"
    os.environ[ENV_NAME] = load_or_create_secret(data_dir)
    return str(data_dir / SECRET_FILE_NAME)
