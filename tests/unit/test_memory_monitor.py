"""Memory sampling, the leak alarm, malloc's counters and the loop-lag monitor: the maths and the
process-level parts, without an engine or a server (the server side: tests/system/ops/test_maintenance.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from harness.waiting import until
from services.config import Settings
from services.memory import PRELOAD_LIBRARIES, find_library
from services.observability.maintenance import LoopLagMonitor, malloc_trim
from services.observability.memory import MB, MemoryMonitor, MemorySample, ProcessMemory, process_tree_memory
from services.observability.series import SampleRing, theil_sen_slope
from tests.fakes import FakeClock


# --- the maths, no engine ---------------------------------------------------------
def fake_sample(at: float, anon_mb: float) -> MemorySample:
    process = ProcessMemory(pid=1, role="app", rss=int(anon_mb * MB), vms=0, uss=None,
                            anon=int(anon_mb * MB), swap=0)  # fmt: skip
    return MemorySample(at=at, processes=(process,))


def leak_monitor(clock: FakeClock, **changes: float) -> MemoryMonitor:
    """A monitor alarmed at 10 MB/hour after a 300 s warm-up, over an hour's window, in 1,000 samples
    (`changes`: MemoryMonitor's samples_kept, warmup_seconds or window_seconds instead)."""
    options = {"warmup_seconds": 300.0, "window_seconds": 3600.0, "samples_kept": 1000, **changes}
    settings = Settings.from_env({}).replace(leak_alarm_mb_per_hour=10.0)
    return MemoryMonitor(settings, clock=clock, **options)  # type: ignore[arg-type]


def feed(monitor: MemoryMonitor, clock: FakeClock, seconds: float, step: float, mb_at) -> None:
    """Record a sample every `step` seconds for `seconds`, memory given by `mb_at(t since start)`."""
    start = clock.now
    for t in np.arange(0, seconds, step):
        clock.now = start + t
        monitor.record(fake_sample(clock.now, mb_at(clock.now - monitor.started_at)))


def test_theil_sen_ignores_spikes() -> None:
    times = np.arange(100.0)
    values = 2.0 * times + 5
    values[[10, 40, 41, 77]] += [500, -300, 800, 1000]
    assert theil_sen_slope(times, values) == pytest.approx(2.0)


def test_ring_keeps_the_newest_rows_in_memory_allocated_once() -> None:
    ring = SampleRing(10, ["a", "b"])
    size = ring.nbytes
    for i in range(25):
        ring.append(float(i), {"a": i, "b": None})
    assert len(ring) == 10
    assert ring.times().tolist() == [float(i) for i in range(15, 25)]
    assert ring.column("a").tolist() == [float(i) for i in range(15, 25)]
    assert np.isnan(ring.column("b")).all()
    assert ring.nbytes == size


def test_leak_alarm_fires_on_steady_growth_after_warm_up(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    monitor = leak_monitor(clock)
    rng = np.random.default_rng(0)

    def memory(t: float) -> float:  # a warm-up jump, then 30 MB/hour with noise
        return 1000 + min(t, 300) + max(0.0, t - 300) * 30 / 3600 + rng.normal(0, 2)

    with caplog.at_level(logging.WARNING, logger="services.observability.memory"):
        feed(monitor, clock, seconds=300 + 1700, step=10, mb_at=memory)
        assert monitor.slope_mb_per_hour is None, "no verdict before half a window of data"
        assert not monitor.alarm
        feed(monitor, clock, seconds=500, step=10, mb_at=memory)
    assert monitor.slope_mb_per_hour == pytest.approx(30, rel=0.15)
    assert monitor.alarm
    warnings = [r for r in caplog.records if "memory leak alarm" in r.message]
    assert len(warnings) == 1, "warned once, not at every sample"


def test_flat_memory_with_spikes_raises_no_alarm(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    monitor = leak_monitor(clock)
    rng = np.random.default_rng(1)

    def memory(t: float) -> float:  # warm-up growth, then flat with noise and bursts of load
        burst = 300 if 2400 <= t < 2500 or 5000 <= t < 5100 else 0
        return 1000 + min(t, 300) + burst + rng.normal(0, 3)

    with caplog.at_level(logging.WARNING, logger="services.observability.memory"):
        feed(monitor, clock, seconds=2 * 3600, step=10, mb_at=memory)
    assert monitor.slope_mb_per_hour is not None
    assert abs(monitor.slope_mb_per_hour) < 3
    assert not monitor.alarm
    assert not [r for r in caplog.records if "memory leak alarm" in r.message]


def test_alarm_clears_when_growth_stops() -> None:
    clock = FakeClock()
    monitor = leak_monitor(clock, warmup_seconds=0.0, window_seconds=600.0)
    feed(monitor, clock, seconds=600, step=5, mb_at=lambda t: 1000 + t * 100 / 3600)
    assert monitor.alarm
    feed(monitor, clock, seconds=900, step=5, mb_at=lambda t: 1017)
    assert not monitor.alarm
    assert monitor.slope_mb_per_hour == pytest.approx(0, abs=0.5)


def test_memory_ring_tracks_each_process_in_its_own_slot() -> None:
    clock = FakeClock()
    monitor = leak_monitor(clock, samples_kept=20)
    for i in range(30):
        processes = tuple(ProcessMemory(n, f"proc{n}", (n + 1) * MB, 0, None, None, None) for n in range(12))
        monitor.record(MemorySample(at=clock.now + i, processes=processes))
    series = monitor.process_series("rss")
    assert len(series) == 8, "a bounded number of slots; the rest share 'other'"
    assert series["proc0"][-1] == MB
    assert series["other"][-1] == sum((n + 1) * MB for n in range(7, 12))
    assert len(monitor.ring) == 20


def test_process_tree_memory_covers_child_processes() -> None:
    code = "import time; block = bytearray(64 * 1024 * 1024); time.sleep(60)"
    child = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 20
        while True:
            tree = {p.pid: p for p in process_tree_memory()}
            if child.pid in tree and (tree[child.pid].anon or 0) > 60 * MB:
                break
            assert time.monotonic() < deadline, f"child memory not seen: {tree.get(child.pid)}"
            time.sleep(0.1)
    finally:
        child.kill()
        child.wait()
    app = next(iter(tree.values()))
    assert app.role == "app" and app.pid == psutil.Process().pid
    assert app.uss and app.anon and app.swap is not None, "USS, RssAnon and VmSwap on Linux"
    assert tree[child.pid].anon_swap > 60 * MB


def test_malloc_trim_runs_on_glibc() -> None:
    assert malloc_trim() in (True, False)


MALLOC_INFO_SCRIPT = """
import json
from services.observability.maintenance import malloc_info
before = malloc_info()
held = [bytes(1000) + str(i).encode() for i in range(20_000)]  # ~20 MB in 1 KB blocks
during = malloc_info()
del held
print(json.dumps([before, during, malloc_info()]))
"""


@pytest.mark.parametrize("allocator", ["glibc", "jemalloc"])
def test_malloc_info_counts_what_the_program_holds(allocator: str) -> None:
    """Objects over 512 bytes come from malloc (Python's own arenas hold the smaller ones). With
    APP_ALLOCATOR=jemalloc the app's /status reports jemalloc's totals, not glibc's idle heap."""
    env = {name: value for name, value in os.environ.items() if name not in ("LD_PRELOAD", "MALLOC_CONF")}
    if allocator == "jemalloc":
        library = find_library(PRELOAD_LIBRARIES["jemalloc"])
        assert library is not None, "run scripts/setup.sh: it installs libjemalloc2"
        env["LD_PRELOAD"] = str(library)
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run([sys.executable, "-c", MALLOC_INFO_SCRIPT], cwd=root, env=env,
                            capture_output=True, text=True, timeout=120, check=True)  # fmt: skip
    before, during, after = json.loads(result.stdout)
    assert before is not None, "glibc >= 2.33 on Linux"
    assert during["in_use_bytes"] - before["in_use_bytes"] > 15 * MB
    assert during["in_use_bytes"] - after["in_use_bytes"] > 15 * MB
    assert after["free_in_heaps_bytes"] >= 0 and after["mmapped_bytes"] >= 0
    if allocator == "jemalloc":
        assert after["mmapped_bytes"] >= after["in_use_bytes"] > 0, "all jemalloc has mapped"


@pytest.mark.asyncio
async def test_loop_lag_monitor_sees_a_blocking_call() -> None:
    monitor = LoopLagMonitor(probe_seconds=0.05, kept=100)
    task = asyncio.create_task(monitor.run())
    try:
        await asyncio.sleep(0.2)  # a few probes of a free loop
        assert monitor.max_seconds < 0.25, "no lag invented (up to 0.04 s here with a core busy elsewhere)"
        time.sleep(0.6)  # the blocking call under test: the probe due in it is 0.55 s late at least
        await until(lambda: monitor.max_seconds >= 0.5, "the lag seen")
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


# --- a real server with short-lived sessions -------------------------------------
