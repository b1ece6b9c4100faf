"""Kill the engine's processes when the app dies without shutting them down (SIGKILL, OOM kill).

vLLM's EngineCore does not watch its parent: an app killed with no chance to
clean up leaves EngineCore and its worker running, holding the model, the KV
cache and a busy core, and a supervisor that restarts the app then runs two
engines. `OrphanGuard` starts this module as a small process that reads the
engine's pids from a pipe. The pipe closes when the app exits, however it
exits; the guard then kills those pids that are still the same processes.
After a clean shutdown nothing is left to kill and it just exits.

    python -m services.reaper    # reads "<pid> <create_time>" lines until EOF
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from pathlib import Path

import psutil

GRACE_SECONDS = 5.0  # after SIGTERM, before SIGKILL


class OrphanGuard:
    """The app's side: a reaper process that outlives the app and holds its engine pids."""

    def __init__(self, processes: list[psutil.Process]) -> None:
        # Its own session: a terminal's Ctrl-C must not stop it before the engine.
        self._process = subprocess.Popen(
            [sys.executable, "-m", "services.reaper"],
            stdin=subprocess.PIPE,
            cwd=Path(__file__).resolve().parent.parent,
            start_new_session=True,
            text=True,
        )
        assert self._process.stdin is not None
        lines = []
        for process in processes:
            with contextlib.suppress(psutil.Error):
                lines.append(f"{process.pid} {process.create_time()}\n")
        self._process.stdin.writelines(lines)
        self._process.stdin.flush()  # kept open: its end is the app's death notice

    @property
    def pid(self) -> int:
        return self._process.pid

    def close(self, timeout: float = GRACE_SECONDS + 5) -> None:
        """After the engine's own shutdown: let the reaper check (nothing left) and exit."""
        with contextlib.suppress(OSError):
            assert self._process.stdin is not None
            self._process.stdin.close()
        try:
            self._process.wait(timeout)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()


def still_running(pid: int, create_time: float) -> psutil.Process | None:
    """The process `pid` if it is still the one that was recorded (pids are reused)."""
    with contextlib.suppress(psutil.Error):
        process = psutil.Process(pid)
        if abs(process.create_time() - create_time) < 0.01 and process.status() != psutil.STATUS_ZOMBIE:
            return process
    return None


def reap(targets: list[tuple[int, float]]) -> int:
    """SIGTERM the recorded processes still alive, SIGKILL those left after a grace; return the count."""
    alive = [p for p in (still_running(pid, created) for pid, created in targets) if p is not None]
    for process in alive:
        with contextlib.suppress(psutil.Error):
            process.terminate()
    _, left = psutil.wait_procs(alive, timeout=GRACE_SECONDS)
    for process in left:
        with contextlib.suppress(psutil.Error):
            process.kill()
    return len(alive)


def main() -> int:
    targets = []
    for line in sys.stdin:  # blocks until the app closes the pipe or dies
        pid, created = line.split()
        targets.append((int(pid), float(created)))
    killed = reap(targets)
    if killed:
        message = f"reaper: the app exited without stopping its engine; stopped {killed} process(es)"
        print(message, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
