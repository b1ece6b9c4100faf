"""The orphan guard: engine processes die with the app, however the app dies."""

from __future__ import annotations

import subprocess
import time

import psutil

from services.reaper import OrphanGuard, reap


def sleeper() -> psutil.Process:
    return psutil.Process(subprocess.Popen(["sleep", "60"]).pid)


def test_the_guard_stops_processes_left_running_when_its_pipe_closes() -> None:
    engine = sleeper()
    guard = OrphanGuard([engine])
    assert psutil.Process(guard.pid).is_running()
    guard.close()  # as if the app died: the engine was never shut down
    assert engine.wait(5) is not None, "the left-over process was stopped"
    assert not psutil.pid_exists(guard.pid) or psutil.Process(guard.pid).status() == psutil.STATUS_ZOMBIE


def test_the_guard_exits_quietly_after_a_clean_shutdown() -> None:
    engine = sleeper()
    guard = OrphanGuard([engine])
    engine.terminate()
    engine.wait(5)
    started = time.monotonic()
    guard.close()
    assert time.monotonic() - started < 3, "nothing to stop: it exits at once"


def test_a_reused_pid_is_left_alone() -> None:
    bystander = sleeper()
    try:
        assert reap([(bystander.pid, bystander.create_time() - 100)]) == 0, "another process now has the pid"
        assert bystander.is_running()
    finally:
        bystander.kill()
        bystander.wait(5)
