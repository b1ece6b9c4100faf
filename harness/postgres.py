"""A throwaway PostgreSQL cluster from Debian's `postgresql` package, on a free loopback port.

initdb in a fresh folder (as the `postgres` user when run as root: PostgreSQL refuses to run as
root), trust authentication on loopback only, fsync off (it is thrown away). Stop and start it
again to make the database disappear and come back under a running app.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from harness.server import free_port


def postgres_bin_dir() -> Path | None:
    """The newest installed server's bin folder (Debian keeps them per version), or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


class PostgresCluster:
    """One cluster: `start()`, `create_database(name)`, `url(name)`, `stop()`, `remove()`."""

    def __init__(self) -> None:
        bin_dir = postgres_bin_dir()
        if bin_dir is None:
            raise RuntimeError("PostgreSQL is not installed: run scripts/setup.sh --test")
        self.bin_dir = bin_dir
        # Outside the tests' private temp folder, which only root may enter.
        self.root = Path(tempfile.mkdtemp(prefix="chat-pg-", dir="/tmp"))
        self.data_dir = self.root / "data"
        self.log_path = self.root / "postgres.log"
        self.port = free_port()
        self._as_postgres = os.geteuid() == 0
        if self._as_postgres:
            shutil.chown(self.root, "postgres", "postgres")
        self._run(
            "initdb", "-D", str(self.data_dir), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"
        )

    def _run(self, program: str, *args: str) -> subprocess.CompletedProcess:
        command = [str(self.bin_dir / program), *args]
        if self._as_postgres:
            command = ["runuser", "-u", "postgres", "--", *command]
        return subprocess.run(command, check=True, capture_output=True, text=True, timeout=120)

    def start(self) -> PostgresCluster:
        options = (
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=100"
        )
        self._run("pg_ctl", "-D", str(self.data_dir), "-l", str(self.log_path), "-o", options, "-w", "start")
        return self

    def stop(self) -> None:
        """Fast shutdown: open connections are cut, as when a database server goes away."""
        self._run("pg_ctl", "-D", str(self.data_dir), "-m", "fast", "-w", "stop")

    def create_database(self, name: str) -> str:
        self._run("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", name)
        return self.url(name)

    def url(self, name: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{name}"

    def remove(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):  # already stopped
            self.stop()
        shutil.rmtree(self.root, ignore_errors=True)
