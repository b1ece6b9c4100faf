"""Which processes are the engine's, how they are stopped, and the guard that stops them if the app dies.

vLLM runs EngineCore and its workers as child processes that title themselves
``VLLM::EngineCore``, ``VLLM::Worker``... `engine_processes` is the one place
that finds them and `reap` the one place that stops them.

EngineCore does not watch its parent: an app killed with no chance to clean
up (SIGKILL, the OOM killer) would leave EngineCore and its worker running,
holding the model, the KV cache and a busy core. `OrphanGuard` starts this
module as a small process that reads the engine's pids and its private RPC
folder from a pipe. The pipe closes when the app exits, however it exits; the
guard then stops those pids that are still the same processes and removes the
folder. After a clean shutdown nothing is left to stop and it just exits.

    python -m services.engine.backends.local.processes
        # reads "dir <path>" and "<pid> <create_time>" lines until EOF
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import subprocess
import sys
from pathlib import Path

import psutil

logger = logging.getLogger(__name__)

GRACE_SECONDS = 5.0  # after SIGTERM, before SIGKILL
ENGINE_TITLE_PREFIX = "VLLM::"


def process_role(process: psutil.Process) -> str:
    """What a process in the app's tree is: EngineCore, Worker... for vLLM's, else its name."""
    with contextlib.suppress(psutil.Error):
        name = process.name()
        if name.startswith(ENGINE_TITLE_PREFIX):
            return name.removeprefix(ENGINE_TITLE_PREFIX)
        title = process.cmdline()[:1]
        if title and title[0].startswith(ENGINE_TITLE_PREFIX):  # name() is cut at 15 characters
            return title[0].removeprefix(ENGINE_TITLE_PREFIX).split()[0]
        if any("resource_tracker" in part for part in process.cmdline()):
            return "resource_tracker"
        return name
    return "gone"


def is_engine_process(process: psutil.Process) -> bool:
    with contextlib.suppress(psutil.Error):
        title = process.cmdline()[:1]
        return process.name().startswith(ENGINE_TITLE_PREFIX) or bool(
            title and title[0].startswith(ENGINE_TITLE_PREFIX)
        )
    return False


def engine_processes(root: psutil.Process | None = None) -> list[psutil.Process]:
    """vLLM's processes under `root` (default: this process)."""
    root = root or psutil.Process()
    with contextlib.suppress(psutil.Error):
        return [p for p in root.children(recursive=True) if is_engine_process(p)]
    return []


def is_running(process: psutil.Process) -> bool:
    with contextlib.suppress(psutil.Error):
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    return False


def reap(processes: list[psutil.Process], grace_seconds: float = GRACE_SECONDS) -> list[psutil.Process]:
    """SIGTERM the processes still running, SIGKILL those left after `grace_seconds`; return them all.

    Needed after an engine shutdown too: when EngineCore dies (e.g. a step
    passes vLLM's execute timeout), its worker is re-parented to init and
    keeps computing; nothing else would stop it.
    """
    alive = [p for p in processes if is_running(p)]
    for process in alive:
        with contextlib.suppress(psutil.Error):
            process.terminate()
    _, left = psutil.wait_procs(alive, timeout=grace_seconds)
    for process in left:
        with contextlib.suppress(psutil.Error):
            logger.warning("killing engine process %s left after shutdown", process.pid)
            process.kill()
    return alive


class OrphanGuard:
    """The app's side: a guard process that outlives the app and holds its engine pids and RPC folder."""

    def __init__(self, processes: list[psutil.Process], rpc_dir: str) -> None:
        # Its own session: a terminal's Ctrl-C must not stop it before the engine.
        self._process = subprocess.Popen(
            [sys.executable, "-m", "services.engine.backends.local.processes"],
            stdin=subprocess.PIPE,
            cwd=Path(__file__).resolve().parents[4],  # the repository
            start_new_session=True,
            text=True,
        )
        assert self._process.stdin is not None
        lines = [f"dir {rpc_dir}\n"]
        for process in processes:
            with contextlib.suppress(psutil.Error):
                lines.append(f"{process.pid} {process.create_time()}\n")
        self._process.stdin.writelines(lines)
        self._process.stdin.flush()  # kept open: its end is the app's death notice

    @property
    def pid(self) -> int:
        return self._process.pid

    def close(self, timeout: float = GRACE_SECONDS + 5) -> None:
        """After the engine's own shutdown: let the guard check (nothing left), clean up and exit."""
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
        if abs(process.create_time() - create_time) < 0.01 and is_running(process):
            return process
    return None


def main() -> int:
    """The guard: wait for the app's pipe to close, then stop what it left and remove its RPC folder."""
    recorded: list[tuple[int, float]] = []
    folders: list[str] = []
    for line in sys.stdin:  # blocks until the app closes the pipe or dies
        first, rest = line.rstrip("\n").split(" ", 1)
        if first == "dir":
            folders.append(rest)
        else:
            recorded.append((int(first), float(rest)))
    found = [still_running(pid, created) for pid, created in recorded]
    stopped = reap([p for p in found if p is not None])
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)
    if stopped:
        message = (
            f"engine guard: the app exited without stopping its engine; stopped {len(stopped)} process(es)"
        )
        print(message, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
