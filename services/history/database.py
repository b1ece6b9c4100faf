"""Which database, and one SQLAlchemy async engine for it: SQLite in DATA_DIR, or PostgreSQL by URL."""

from __future__ import annotations

import _sqlite3
import contextlib
import ctypes
import os
import stat
from collections.abc import Callable
from functools import cache, partial
from pathlib import Path
from typing import Any

from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from services.config import Settings, SettingsError

SQLITE_FILE_NAME = "chat.db"
SQLITE_SUFFIXES = ("", "-wal", "-shm", "-journal")  # the database and the files SQLite keeps beside it
POOL_SIZE = 5  # connections kept open
POOL_OVERFLOW = 5  # more opened under load, closed when returned
# Page cache of each pooled SQLite connection, in KiB (SQLite's default is 2,000): the files stay in the
# operating system's cache, so a small one costs little and bounds the app's memory.
SQLITE_CACHE_KIB = 512


def ensure_data_dir(settings: Settings) -> Path:
    """DATA_DIR, private to the app's user (0700) whatever mode it had: it holds the accounts, the
    conversations and the sign-in secret. A shared folder (sticky, like /tmp) is refused."""
    path = Path(settings.data_dir).expanduser()
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    if path.stat().st_mode & stat.S_ISVTX:
        raise SettingsError(f"DATA_DIR={path} is a shared folder (like /tmp): give the app one of its own")
    os.chmod(path, 0o700)
    return path


def secure_sqlite_files(path: Path) -> None:
    """The database created private (0600) before SQLite creates it (its -wal, -shm and -journal
    files take its mode), and each of them that exists tightened to 0600, whatever the umask was."""
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))  # an existing file is left as it is
    for suffix in SQLITE_SUFFIXES:
        with contextlib.suppress(FileNotFoundError):
            os.chmod(f"{path}{suffix}", 0o600)


def database_url(settings: Settings) -> str:
    """The SQLAlchemy URL with its async driver: asyncpg for PostgreSQL, aiosqlite for SQLite."""
    url = settings.database_url.strip()
    if not url:
        return f"sqlite+aiosqlite:///{ensure_data_dir(settings) / SQLITE_FILE_NAME}"
    scheme, _, rest = url.partition("://")
    if scheme in ("postgresql", "postgres", "postgresql+asyncpg"):
        return f"postgresql+asyncpg://{rest}"
    if scheme in ("sqlite", "sqlite+aiosqlite"):
        return f"sqlite+aiosqlite://{rest}"
    raise ValueError(f"unsupported DATABASE_URL scheme {scheme!r}")


def is_sqlite(url: str) -> bool:
    return url.startswith("sqlite")


def connect_args(settings: Settings, url: str) -> dict[str, Any]:
    """Timeouts that turn a locked or unreachable database into an error instead of a hang."""
    if is_sqlite(url):
        return {"timeout": settings.database_timeout_seconds}  # SQLite's busy timeout
    return {"timeout": settings.database_timeout_seconds, "command_timeout": 60}


def create_engine(settings: Settings) -> AsyncEngine:
    """An async engine with bounded pools; connections are checked before use, so a restarted
    PostgreSQL is reconnected to instead of failing the first statement."""
    url = database_url(settings)
    if (path := sqlite_file(url)) is not None:
        secure_sqlite_files(path)
    engine = create_async_engine(
        url,
        connect_args=connect_args(settings, url),
        pool_pre_ping=True,
        pool_size=POOL_SIZE,
        max_overflow=POOL_OVERFLOW,
        pool_timeout=settings.database_timeout_seconds,
    )
    if is_sqlite(url):
        event.listen(engine.sync_engine, "connect", partial(_sqlite_pragmas, SQLITE_CACHE_KIB))
    return engine


def _sqlite_pragmas(cache_kib: int, connection: Any, _record: Any) -> None:
    """WAL: readers never wait for the writer, and several processes may share the file.
    A bounded page cache per pooled connection: POOL_SIZE x cache_kib at most."""
    cursor = connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute(f"PRAGMA cache_size=-{int(cache_kib)}")  # negative: KiB, not pages
    cursor.close()


@cache
def _sqlite_memory_used() -> Callable[[], int] | None:
    try:
        function = ctypes.CDLL(_sqlite3.__file__).sqlite3_memory_used  # the library Python's sqlite3 uses
    except (OSError, AttributeError):  # linked in without exported symbols
        return None
    function.restype = ctypes.c_int64
    return function


def sqlite_memory_bytes() -> int | None:
    """Heap bytes SQLite holds in this process (page caches, schemas, statements), or None if unknown."""
    function = _sqlite_memory_used()
    return None if function is None else int(function())


def sqlite_path(settings: Settings) -> Path | None:
    """The SQLite file, or None on PostgreSQL (for sizes and backups)."""
    return sqlite_file(database_url(settings))


def sqlite_file(url: str) -> Path | None:
    """The file of a SQLite URL; None for PostgreSQL and in-memory databases."""
    _, separator, path = url.partition(":///")
    if not is_sqlite(url) or not separator or path in ("", ":memory:"):
        return None
    return Path(path)


def file_size_bytes(path: Path) -> int:
    """The database file plus its WAL and shared-memory files."""
    return sum(os.path.getsize(p) for p in (path, Path(f"{path}-wal"), Path(f"{path}-shm")) if p.exists())
