"""Memory probe inside vLLM's spawned processes: tracemalloc snapshots and jemalloc heap profiles.

Python imports this file as `sitecustomize` when its folder is on PYTHONPATH,
which services/memory/allocators.py arranges for vLLM's processes when
DIAGNOSTICS is on (it sets ENGINE_MEMORY_PROBE_DIR for them). It uses the
standard library only (it runs before the process has its sys.path) and does
nothing outside multiprocessing children, so the app, the orphan guard and
tools that inherit the variables are left alone. With DIAGNOSTICS on, the app
runs the same probe in its own process through `start(...)`
(services/observability/app_probe.py).

In EngineCore and the worker it writes, on SIGUSR2 and every
ENGINE_MEMORY_PROBE_SECONDS (0 = signal only; ENGINE_MEMORY_PROBE_FRAMES=0: no tracemalloc):
    <dir>/<role>-<pid>-<seq>-<label>.tracemalloc   a tracemalloc snapshot (after gc.collect())
    <dir>/<role>-<pid>-<seq>-<label>.census        JSON: live objects by type (count, shallow bytes)
        and the largest containers by length, with a hint of what they hold; costs nothing
        between snapshots, unlike tracemalloc (the app's probe can run with the census alone)
    <dir>/<role>-<pid>-<seq>-<label>.heap          jemalloc's heap profile, when jemalloc runs with prof:true
    <dir>/counters-<pid>.jsonl                     every COUNTERS_SECONDS and after each snapshot (named):
        jemalloc's allocated/active/metadata/resident/mapped/retained bytes and dirty/muzzy
        pages (when jemalloc is the malloc; else glibc's bytes in use, free and mmapped),
        Python's allocated blocks, pyzmq's zero-copy messages not yet released, threads,
        and anonymous/RSS bytes from /proc
<label> is the text of <dir>/label when present (the churn bench writes its
request count there). The first snapshot and the newest KEEP_NEWEST are kept.
tracemalloc starts with the first snapshot (tracing vLLM's imports would take
minutes), so Python growth is counted from the first snapshot on.
`python -m services.observability.attribution <dir>` diffs them.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable

try:  # vLLM's processes: this folder is on PYTHONPATH
    from allocator_counters import glibc_counters, jemalloc_counters, jemalloc_mallctl, pymalloc_counters
except ImportError:  # the app imports the probe as a module of services
    from services.memory.probe.allocator_counters import (
        glibc_counters,
        jemalloc_counters,
        jemalloc_mallctl,
        pymalloc_counters,
    )

TRACEMALLOC_FRAMES = 16
KEEP_NEWEST = 12
COUNTERS_SECONDS = 30
# Set by start(): a role that replaces the process title, more counters for each line, and
# whether each census also walks every reachable object (object_census.reachable_objects).
ROLE: str | None = None
EXTRA_COUNTERS: Callable[[], dict[str, float]] | None = None
DEEP_CENSUS = False


def process_role() -> str:
    """EngineCore, Worker_TP0, ... from the title vLLM gives its processes (setproctitle)."""
    if ROLE is not None:
        return ROLE
    try:
        with open("/proc/self/cmdline", "rb") as file:
            title = file.read().split(b"\0")[0].decode(errors="replace").split()[0]
    except (OSError, IndexError):
        title = "process"
    title = title.removeprefix("VLLM::") if title.startswith("VLLM::") else os.path.basename(title)
    return "".join(c if c.isalnum() or c == "_" else "_" for c in title)[:40] or "process"


def jemalloc_dump(path: str) -> bool:
    """Ask jemalloc (when it is this process's malloc and profiling is on) to write its heap profile."""
    import ctypes

    mallctl = jemalloc_mallctl()
    if mallctl is None:
        return False
    name = ctypes.c_char_p(path.encode())
    return mallctl(b"prof.dump", None, None, ctypes.byref(name), ctypes.sizeof(name)) == 0


def process_counters(after_snapshot: str | None = None) -> dict[str, float | str]:
    """One line of counters for this process (see the module's docstring)."""
    import time

    line: dict[str, float | str] = {"time": round(time.time(), 1), "role": process_role()}
    if after_snapshot:
        line["snapshot"] = after_snapshot
    line.update(jemalloc_counters() or glibc_counters())
    line["python_allocated_blocks"] = sys.getallocatedblocks()
    line.update(pymalloc_counters())
    garbage = sys.modules.get("zmq.utils.garbage")
    if garbage is not None:
        line["pyzmq_pending_zero_copy"] = len(garbage.gc.refs)
    line["threads"] = threading.active_count()
    if EXTRA_COUNTERS is not None:
        line.update(EXTRA_COUNTERS())
    with open("/proc/self/smaps_rollup", encoding="ascii") as file:
        for row in file:
            key, _, rest = row.partition(":")
            if key in ("Rss", "Anonymous"):
                line[key.lower() + "_bytes"] = int(rest.split()[0]) * 1024
    return line


def append_counters(directory: str, after_snapshot: str | None = None) -> None:
    """Append one line of this process's counters to <dir>/counters-<pid>.jsonl (naming the
    snapshot it follows, if any)."""
    import json

    path = os.path.join(directory, f"counters-{os.getpid()}.jsonl")  # the role is set after start
    try:
        with open(path, "a", encoding="utf-8") as file:
            file.write(json.dumps(process_counters(after_snapshot)) + "\n")
    except Exception as error:  # counters must not stop the engine
        print(f"memory probe: counters failed: {error!r}", file=sys.stderr)


def record_counters(directory: str) -> None:
    import time

    while True:
        append_counters(directory)
        time.sleep(COUNTERS_SECONDS)


def read_label(directory: str) -> str:
    try:
        with open(os.path.join(directory, "label"), encoding="utf-8") as file:
            text = file.read().strip()
    except OSError:
        return "t"
    return "".join(c for c in text if c.isalnum() or c in "_.")[:40] or "t"


def prune(directory: str, prefix: str) -> None:
    """Keep the first snapshot of this process and its KEEP_NEWEST latest."""
    sequences = sorted(
        {name[len(prefix) :].split("-")[0] for name in os.listdir(directory) if name.startswith(prefix)}
    )
    for old in sequences[1:-KEEP_NEWEST]:
        for name in os.listdir(directory):
            if name.startswith(f"{prefix}{old}-"):
                os.remove(os.path.join(directory, name))


def snapshot(directory: str, sequence: int, tracemalloc_frames: int) -> None:
    """Write one census, tracemalloc snapshot (unless frames is 0) and jemalloc profile of this process."""
    import gc
    import json
    import tracemalloc

    if tracemalloc_frames and not tracemalloc.is_tracing():  # from the first snapshot on: tracing
        tracemalloc.start(tracemalloc_frames)  # imports would take minutes
    prefix = f"{process_role()}-{os.getpid()}-"
    base = os.path.join(directory, f"{prefix}{sequence:05d}-{read_label(directory)}")
    gc.collect()
    jemalloc_dump(base + ".heap")
    try:
        from object_census import census  # vLLM's processes: this folder is on PYTHONPATH
    except ImportError:  # the app imports the probe as a module of services
        from services.memory.probe.object_census import census
    with open(base + ".census.partial", "w", encoding="utf-8") as file:
        json.dump(census(DEEP_CENSUS), file)
    os.replace(base + ".census.partial", base + ".census")
    if tracemalloc.is_tracing():
        tracemalloc.take_snapshot().dump(base + ".tracemalloc.partial")
        os.replace(base + ".tracemalloc.partial", base + ".tracemalloc")
    prune(directory, prefix)
    append_counters(directory, os.path.basename(base))


def run(
    directory: str, interval_seconds: float | None, wake: threading.Event, tracemalloc_frames: int
) -> None:
    sequence = 0
    while True:
        wake.wait(interval_seconds)
        wake.clear()
        try:
            snapshot(directory, sequence, tracemalloc_frames)
        except Exception as error:  # a failed snapshot must not stop the engine
            print(f"memory probe: snapshot failed: {error!r}", file=sys.stderr)
        sequence += 1


def start(
    directory: str,
    interval_seconds: float | None,
    role: str | None = None,
    extra_counters: Callable[[], dict[str, float]] | None = None,
    tracemalloc_frames: int = TRACEMALLOC_FRAMES,
    deep_census: bool = False,
) -> None:
    """Snapshot on SIGUSR2 (when called from the main thread) and every `interval_seconds`; counters
    every COUNTERS_SECONDS. Once per process: the threads live as long as it does."""
    global ROLE, EXTRA_COUNTERS, DEEP_CENSUS
    if any(thread.name == "memory-probe" for thread in threading.enumerate()):
        return
    import signal

    ROLE = role
    EXTRA_COUNTERS = extra_counters
    DEEP_CENSUS = deep_census
    wake = threading.Event()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGUSR2, lambda *_: wake.set())
    threading.Thread(
        target=run,
        args=(directory, interval_seconds, wake, tracemalloc_frames),
        name="memory-probe",
        daemon=True,
    ).start()
    threading.Thread(target=record_counters, args=(directory,), name="memory-counters", daemon=True).start()


def install() -> None:
    directory = os.environ.get("ENGINE_MEMORY_PROBE_DIR")
    if not directory or "--multiprocessing-fork" not in sys.orig_argv:
        return
    frames = os.environ.get("ENGINE_MEMORY_PROBE_FRAMES", "")
    seconds = float(os.environ.get("ENGINE_MEMORY_PROBE_SECONDS") or 0) or None
    start(directory, seconds, tracemalloc_frames=int(frames) if frames.isdigit() else TRACEMALLOC_FRAMES)


install()
