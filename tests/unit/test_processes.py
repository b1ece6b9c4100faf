"""Engine processes: found by their titles, stopped by one function, and never outliving the app."""

from __future__ import annotations

import subprocess
import tempfile
import time
from pathlib import Path

import psutil

from harness.waiting import WAIT_SECONDS, until_sync
from services.engine.backends.local import worker_thread_bind, worker_thread_env
from services.engine.backends.local.processes import OrphanGuard, process_role, reap, still_running


def sleeper() -> psutil.Process:
    return psutil.Process(subprocess.Popen(["sleep", "60"]).pid)


def rpc_folder() -> Path:
    folder = Path(tempfile.mkdtemp(prefix="vllm-chat-rpc-test-"))
    (folder / "socket-file").write_text("")
    return folder


def test_the_guard_stops_processes_left_running_and_removes_the_rpc_folder() -> None:
    engine, folder = sleeper(), rpc_folder()
    guard = OrphanGuard([engine], str(folder))
    assert psutil.Process(guard.pid).is_running()
    # As if the app died: the engine was never shut down. The guard takes its whole grace period
    # (the engine is our child: a zombie until we reap it, it looks alive) plus its start: 5.5 s
    # here with a core busy elsewhere, too close to the 10 s close allows by default.
    guard.close(timeout=WAIT_SECONDS)
    assert engine.wait(5) is not None, "the left-over process was stopped"
    assert not folder.exists(), "the engine's RPC folder was removed"
    assert not psutil.pid_exists(guard.pid) or psutil.Process(guard.pid).status() == psutil.STATUS_ZOMBIE


def test_the_guard_exits_quietly_after_a_clean_shutdown() -> None:
    engine, folder = sleeper(), rpc_folder()
    guard = OrphanGuard([engine], str(folder))
    engine.terminate()
    engine.wait(5)
    # Timed from when it waits on its pipe: its start (up to 1.3 s here with a core busy elsewhere)
    # is not what this checks. It then exits in 0.05 s, not after a grace period of 5 s.
    until_sync(lambda: psutil.Process(guard.pid).status() == psutil.STATUS_SLEEPING, "the guard waits")
    started = time.monotonic()
    guard.close()
    assert time.monotonic() - started < 3, "nothing to stop: it exits at once"
    assert not folder.exists()


def test_a_reused_pid_is_left_alone() -> None:
    bystander = sleeper()
    try:
        assert still_running(bystander.pid, bystander.create_time() - 100) is None, (
            "another process has the pid"
        )
        assert reap([]) == [] and bystander.is_running()
    finally:
        bystander.kill()
        bystander.wait(5)


def test_reap_terminates_then_kills() -> None:
    shell = subprocess.Popen(["sh", "-c", "trap '' TERM; echo ready; exec sleep 60"], stdout=subprocess.PIPE)
    assert shell.stdout is not None and shell.stdout.readline() == b"ready\n", "the trap is installed"
    stubborn = psutil.Process(shell.pid)
    started = time.monotonic()
    assert reap([stubborn], grace_seconds=0.5) == [stubborn]
    assert stubborn.wait(5) is not None
    assert 0.4 < time.monotonic() - started < 5, "SIGKILL after the grace period (0.65 s here, loaded)"
    shell.stdout.close()


def test_process_role_names_vllm_processes_by_their_title() -> None:
    titled = psutil.Process(subprocess.Popen(["bash", "-c", "exec -a VLLM::EngineCore sleep 60"]).pid)
    try:
        until_sync(lambda: titled.name() == "sleep", "bash execs sleep")
        assert process_role(titled) == "EngineCore"
        assert process_role(psutil.Process()) not in ("EngineCore", "Worker")
    finally:
        titled.kill()
        titled.wait(5)


def test_the_worker_gets_every_core_of_a_small_machine_and_vllms_layout_on_larger_ones() -> None:
    assert worker_thread_bind({0, 1}) == "0,1", "2 cores: both for the worker (bench/engine/thread_layout.py)"
    assert worker_thread_bind({3}) == "3"
    assert worker_thread_bind({2, 5}) == "2,5", "the cores this process may use, not 0..n-1"
    assert worker_thread_bind(set(range(8))) == "auto"
    assert worker_thread_bind(set()) == "auto"
    both = {"VLLM_CPU_OMP_THREADS_BIND": "0,1", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
    assert worker_thread_env({0, 1}) == both
    assert worker_thread_env(set(range(8))) == {"VLLM_CPU_OMP_THREADS_BIND": "auto"}, "vLLM's reserve stays"
