"""The memory tools without an engine: the allocator environment, the launcher, the probe in a child.

The probe tests start real spawned Python children (as vLLM starts EngineCore
and its worker) with the probe's environment, signal them, and read what
they wrote: tracemalloc snapshots, and jemalloc heap profiles through jeprof.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import pytest

from services.config import Settings, SettingsError
from services.memory import allocators
from services.memory.allocators import (
    ENGINE_MMAP_THRESHOLD_BYTES,
    PROBE_DIR,
    app_memory_env,
    apply_engine_memory_env,
    engine_memory_env,
    find_library,
    forget_preload,
)
from services.memory.probe.object_census import reachable_objects
from services.observability.attribution import attribute, find_snapshots, parse_jeprof_text, sampling_noise
from services.observability.memory import MB

JEMALLOC = "libjemalloc.so.2"
ROOT = Path(__file__).resolve().parents[3]
SNAPSHOT_WAIT_SECONDS = 60


# --- the allocator of vLLM's processes -----------------------------------------------------
def test_glibc_keeps_the_pinned_mmap_threshold_and_can_cap_arenas() -> None:
    settings = Settings.from_env({}).replace(engine_allocator="glibc", engine_malloc_arena_max=2)
    env = engine_memory_env(settings, {})
    assert env == {
        "MALLOC_MMAP_THRESHOLD_": str(ENGINE_MMAP_THRESHOLD_BYTES),
        "MALLOC_ARENA_MAX": "2",
    }


@pytest.mark.parametrize("name", ["jemalloc", "tcmalloc"])
def test_preloaded_allocators_come_from_the_installed_debian_library(name: str) -> None:
    library = find_library(allocators.PRELOAD_LIBRARIES[name])
    assert library is not None, f"run scripts/setup.sh: it installs {allocators.DEBIAN_PACKAGES[name]}"
    env = engine_memory_env(Settings.from_env({}).replace(engine_allocator=name), {"LD_PRELOAD": "libx.so"})
    assert env["LD_PRELOAD"] == f"{library}:libx.so"  # an operator's own preload stays
    assert "MALLOC_MMAP_THRESHOLD_" not in env
    assert ("MALLOC_CONF" in env) == (name == "jemalloc")


def test_a_missing_allocator_library_falls_back_to_glibc_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(allocators, "find_library", lambda name: None)
    env = engine_memory_env(Settings.from_env({}).replace(engine_allocator="jemalloc"), {})
    assert "LD_PRELOAD" not in env and "MALLOC_MMAP_THRESHOLD_" in env
    assert "apt-get install libjemalloc2" in caplog.text


def test_an_unknown_allocator_is_refused_at_start() -> None:
    with pytest.raises(SettingsError, match="ENGINE_ALLOCATOR='hoard'"):
        Settings.from_env({"ENGINE_ALLOCATOR": "hoard"})


def test_each_engine_start_begins_from_the_environment_before_the_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(allocators, "_before_us", {})
    monkeypatch.setenv("LD_PRELOAD", "libmine.so")
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    base = Settings.from_env({})
    apply_engine_memory_env(base.replace(engine_allocator="tcmalloc"))
    assert os.environ["LD_PRELOAD"].endswith(":libmine.so")
    apply_engine_memory_env(base.replace(engine_allocator="glibc", engine_malloc_arena_max=2))
    assert os.environ["LD_PRELOAD"] == "libmine.so"
    assert os.environ["MALLOC_ARENA_MAX"] == "2"
    apply_engine_memory_env(base.replace(engine_allocator="glibc"))
    assert "MALLOC_ARENA_MAX" not in os.environ
    apply_engine_memory_env(base.replace(engine_allocator="jemalloc"))
    forget_preload()  # the engine runs: later children (a browser, the plot process) keep their malloc
    assert os.environ["LD_PRELOAD"] == "libmine.so" and "MALLOC_CONF" not in os.environ


# --- the app's own malloc: services.web.launch --------------------------------------
def test_the_app_s_preload_keeps_the_operator_s_and_remembers_what_was_there() -> None:
    library = find_library(JEMALLOC)
    settings = Settings.from_env({}).replace(app_allocator="jemalloc")
    env = app_memory_env(settings, {"LD_PRELOAD": "libx.so"})
    assert env["LD_PRELOAD"] == f"{library}:libx.so"
    assert env["MALLOC_CONF"] == settings.app_jemalloc_conf
    assert json.loads(env[allocators.LAUNCHER_SAVED_ENV]) == {
        "LD_PRELOAD": "libx.so", "MALLOC_CONF": None, "MALLOC_ARENA_MAX": None,
    }  # fmt: skip
    assert "MALLOC_ARENA_MAX" not in app_memory_env(settings.replace(app_malloc_arena_max=2), {})
    assert app_memory_env(settings.replace(app_allocator="glibc", app_malloc_arena_max=0), {}) == {}
    assert app_memory_env(settings, env) == {}, "a second launch changes nothing"


def test_the_app_s_arena_limit_is_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """APP_MALLOC_ARENA_MAX limits the app's glibc; vLLM's processes get ENGINE_MALLOC_ARENA_MAX."""
    monkeypatch.setattr(allocators, "_before_us", {})
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")  # the operator's, before the launcher
    settings = Settings.from_env({}).replace(app_allocator="glibc", app_malloc_arena_max=2)
    env = app_memory_env(settings)
    assert env["MALLOC_ARENA_MAX"] == "2" and "LD_PRELOAD" not in env
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    apply_engine_memory_env(settings.replace(engine_allocator="glibc", engine_malloc_arena_max=0))
    assert os.environ["MALLOC_ARENA_MAX"] == "4", "the engine's glibc starts from the operator's"
    apply_engine_memory_env(settings.replace(engine_allocator="glibc", engine_malloc_arena_max=3))
    assert os.environ["MALLOC_ARENA_MAX"] == "3"


def test_engines_started_by_a_launched_app_begin_from_the_environment_before_the_launcher(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(allocators, "_before_us", {})
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    monkeypatch.delenv("MALLOC_CONF", raising=False)
    settings = Settings.from_env({}).replace(app_allocator="jemalloc", app_jemalloc_conf="narenas:1")
    for name, value in app_memory_env(settings).items():
        monkeypatch.setenv(name, value)
    apply_engine_memory_env(settings.replace(engine_allocator="glibc"))
    assert "LD_PRELOAD" not in os.environ and "MALLOC_CONF" not in os.environ, "not the app's malloc"
    apply_engine_memory_env(settings.replace(engine_allocator="jemalloc"))
    assert os.environ["MALLOC_CONF"] == settings.engine_jemalloc_conf
    forget_preload()  # later children of the app start on plain glibc
    assert "LD_PRELOAD" not in os.environ and "MALLOC_CONF" not in os.environ


LAUNCHED_SCRIPT = """
import ctypes, json, os, tempfile, threading
maps = open(f"/proc/{os.getpid()}/maps").read()
mapped = {name: name in maps for name in %r}
libc = ctypes.CDLL("libc.so.6")  # glibc's own malloc, whatever is preloaded
libc.malloc.restype, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
libc.fopen.restype, libc.fopen.argtypes = ctypes.c_void_p, [ctypes.c_char_p, ctypes.c_char_p]
libc.malloc_info.argtypes, libc.fclose.argtypes = [ctypes.c_int, ctypes.c_void_p], [ctypes.c_void_p]
barrier = threading.Barrier(8)
def allocate():  # eight threads at once: glibc gives each a new arena up to its limit
    barrier.wait(); block = libc.malloc(4096); barrier.wait(); libc.free(block)
threads = [threading.Thread(target=allocate) for _ in range(8)]
for thread in threads: thread.start()
for thread in threads: thread.join()
with tempfile.NamedTemporaryFile("r") as report:
    stream = libc.fopen(report.name.encode(), b"w"); libc.malloc_info(0, stream); libc.fclose(stream)
    arenas = report.read().count("<heap nr=")
print("LAUNCHED", json.dumps({"mapped": mapped, "conf": os.environ.get("MALLOC_CONF"),
                              "arena_max": os.environ.get("MALLOC_ARENA_MAX"), "arenas": arenas}), flush=True)
os._exit(0)
"""


LAUNCHES = [("glibc", 0), ("glibc", 2), ("jemalloc", 2), ("tcmalloc", 2)]  # (APP_ALLOCATOR, arena limit)


@pytest.mark.parametrize(("name", "arena_max"), LAUNCHES)
def test_the_launcher_starts_chainlit_on_app_allocator(name: str, arena_max: int, tmp_path: Path) -> None:
    """`python -m services.web.launch <script>`: Chainlit imports the script, which reports its malloc."""
    script = tmp_path / "report_malloc.py"
    script.write_text(LAUNCHED_SCRIPT % (list(allocators.PRELOAD_LIBRARIES.values()),))
    env = {**os.environ, "CHAINLIT_APP_ROOT": str(tmp_path)}
    env |= {"APP_ALLOCATOR": name, "APP_MALLOC_ARENA_MAX": str(arena_max)}
    for variable in (*allocators.LAUNCHER_ENV_NAMES, allocators.LAUNCHER_SAVED_ENV):
        env.pop(variable, None)
    command = [sys.executable, "-m", "services.web.launch", str(script), "--headless", "--port", "1"]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    line = next((row for row in result.stdout.splitlines() if row.startswith("LAUNCHED")), None)
    assert line is not None, result.stdout + result.stderr
    launched = json.loads(line.removeprefix("LAUNCHED "))
    expected = allocators.PRELOAD_LIBRARIES.get(name)
    assert launched["mapped"] == {
        library: library == expected for library in allocators.PRELOAD_LIBRARIES.values()
    }
    assert launched["conf"] == (Settings.from_env({}).app_jemalloc_conf if name == "jemalloc" else None)
    glibc_arenas = name == "glibc" and arena_max
    assert launched["arena_max"] == (str(arena_max) if glibc_arenas else None)
    if name == "glibc":  # the limit holds: eight threads at once share `arena_max` heaps
        assert launched["arenas"] <= arena_max if arena_max else launched["arenas"] > 2, launched


def test_the_launcher_refuses_an_unknown_allocator_before_chainlit_starts() -> None:
    env = {**os.environ, "APP_ALLOCATOR": "hoard"}
    result = subprocess.run([sys.executable, "-m", "services.web.launch", "app.py"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert result.returncode != 0 and "APP_ALLOCATOR='hoard'" in result.stderr


# --- the probe inside spawned processes -------------------------------------------------
KEPT: list[str] = []


def child_that_grows_on_command(connection: Connection) -> None:
    """A spawned child (like vLLM's worker): grows by 20,000 strings each time it is told to."""
    connection.send("ready")
    while (command := connection.recv()) != "stop":
        if command == "grow":
            KEPT.extend(f"kept by the probe test {i}" * 4 for i in range(20_000))
        connection.send("done")


def probe_env(monkeypatch: pytest.MonkeyPatch, directory: Path, **extra: str) -> None:
    monkeypatch.setenv("ENGINE_MEMORY_PROBE_DIR", str(directory))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(PROBE_DIR), os.environ.get("PYTHONPATH", "")]))
    for name, value in extra.items():
        monkeypatch.setenv(name, value)


def wait_for_snapshots(directory: Path, count: int, suffix: str = ".tracemalloc") -> None:
    deadline = time.monotonic() + SNAPSHOT_WAIT_SECONDS
    while len(list(directory.glob(f"*{suffix}"))) < count:
        assert time.monotonic() < deadline, f"the probe wrote {list(directory.iterdir())}"
        time.sleep(0.1)


def counters_after(directory: Path, label: str) -> list[dict[str, Any]]:
    """The counters lines written right after the snapshots labelled `label`."""
    if not list(directory.glob("counters-*.jsonl")):
        return []
    return [line for line in read_counters(directory) if line.get("snapshot", "").endswith(f"-{label}")]


def wait_for_counters_after(directory: Path, label: str) -> None:
    deadline = time.monotonic() + SNAPSHOT_WAIT_SECONDS
    while not counters_after(directory, label):
        assert time.monotonic() < deadline, f"no counters after the {label!r} snapshot"
        time.sleep(0.1)


def snapshot_grow_snapshot(directory: Path, suffix: str = ".tracemalloc") -> None:
    """Start the child, snapshot it, let it grow, snapshot it again, stop it (each snapshot has
    written its `suffix` file)."""
    parent, child_end = multiprocessing.get_context("spawn").Pipe()
    child = multiprocessing.get_context("spawn").Process(
        target=child_that_grows_on_command, args=(child_end,)
    )
    child.start()
    try:
        assert parent.poll(60) and parent.recv() == "ready"
        (directory / "label").write_text("before")
        os.kill(child.pid, signal.SIGUSR2)
        wait_for_snapshots(directory, 1, suffix)
        parent.send("grow")
        assert parent.poll(60) and parent.recv() == "done"
        (directory / "label").write_text("after")
        os.kill(child.pid, signal.SIGUSR2)
        wait_for_snapshots(directory, 2, suffix)
        wait_for_counters_after(directory, "after")  # the probe's last step, before the child stops
        parent.send("stop")
    finally:
        child.join(10)
        if child.is_alive():
            child.kill()


def test_probe_snapshots_on_signal_and_names_the_site_that_grew(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    probe_env(monkeypatch, tmp_path)
    snapshot_grow_snapshot(tmp_path)
    (process,) = attribute(tmp_path).values()
    python = process["python"]
    assert (python["from"], python["to"]) == ("before", "after")
    top = python["sites"][0]
    assert top["site"].endswith(
        f"test_memory_tools.py:{child_that_grows_on_command.__code__.co_firstlineno + 5}"
    )
    assert top["blocks"] >= 20_000 and top["share_of_growth"] > 0.8
    assert python["net_bytes"] > 2 * MB
    (before,), (after,) = counters_after(tmp_path, "before"), counters_after(tmp_path, "after")
    # 20,000 strings, give or take the few hundred blocks the probe's own census moves
    assert after["python_allocated_blocks"] - before["python_allocated_blocks"] >= 19_000
    assert after["anonymous_bytes"] - before["anonymous_bytes"] > 1 * MB
    assert after["threads"] == before["threads"] >= 3  # main thread, the probe, its counters


def test_probe_without_tracing_writes_a_census_and_glibc_counters_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ENGINE_MEMORY_PROBE_FRAMES=0, the churn bench's `--probe counters`: cheap enough for every sample."""
    probe_env(monkeypatch, tmp_path, ENGINE_MEMORY_PROBE_FRAMES="0")
    snapshot_grow_snapshot(tmp_path, ".census")
    assert not list(tmp_path.glob("*.tracemalloc"))
    (process,) = attribute(tmp_path).values()
    assert set(process) == {"objects"}
    (before,), (after,) = counters_after(tmp_path, "before"), counters_after(tmp_path, "after")
    assert after["python_allocated_blocks"] - before["python_allocated_blocks"] >= 19_000
    assert 0 < before["glibc.in_use"] < before["glibc.heaps"] + before["glibc.mmapped"]
    assert before["glibc.free"] >= 0 and "jemalloc.allocated" not in before


def test_pymalloc_counters_see_small_objects_in_arenas_outside_malloc() -> None:
    """The counters that tell pymalloc's arenas (mmapped by Python, not malloc) from its live blocks.
    In a fresh interpreter, whose arenas have little free space the strings could reuse."""
    code = (
        "import json, tracemalloc\n"
        "from services.memory.probe.allocator_counters import pymalloc_counters\n"
        "before = pymalloc_counters()\n"
        "kept = [f'kept in arenas {i}' * 8 for i in range(20_000)]\n"  # ~150 bytes each
        "after = pymalloc_counters()\n"
        "tracemalloc.start()\n"  # its hooks wrap pymalloc, which then declines to report
        "print(json.dumps([before, after, pymalloc_counters()]))\n"
    )
    root = Path(__file__).resolve().parents[3]
    run = subprocess.run([sys.executable, "-c", code], cwd=root, timeout=60, check=True, capture_output=True)
    before, after, traced = json.loads(run.stdout)
    assert after["pymalloc.allocated_bytes"] - before["pymalloc.allocated_bytes"] > 2.5 * MB
    assert after["pymalloc.arenas"] - before["pymalloc.arenas"] >= 2
    blocks = after["pymalloc.allocated_bytes"] + after["pymalloc.available_bytes"]
    assert after["pymalloc.arenas"] * 2**20 > blocks  # arenas hold the blocks, live and free
    assert after["pymalloc.arenas_highwater"] >= after["pymalloc.arenas"]
    assert traced == {}


def read_counters(directory: Path) -> list[dict[str, Any]]:
    (path,) = directory.glob("counters-*.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.long  # jeprof symbolizes the interpreter and its libraries: 10-100 s, no model
def test_probe_writes_jemalloc_profiles_that_jeprof_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    library = find_library(JEMALLOC)
    assert library is not None, "run scripts/setup.sh: it installs libjemalloc2"
    probe_env(monkeypatch, tmp_path, LD_PRELOAD=str(library), MALLOC_CONF="prof:true,lg_prof_sample:10")
    snapshot_grow_snapshot(tmp_path)
    assert len(list(tmp_path.glob("*.heap"))) == 2
    (process,) = attribute(tmp_path, top=5).values()
    native = process["native"]
    assert "error" not in native, native
    # 20,000 strings of ~100 bytes, sampled (lg_prof_sample:10): about 2-3 MB, most in pymalloc.
    assert 1 * MB < native["net_bytes"] < 20 * MB
    assert 0 < native["sampling_noise_bytes"] < native["net_bytes"] / 4  # the growth is resolved
    assert any("Malloc" in site["site"] or "malloc" in site["site"] for site in native["sites"])
    (before,), (after,) = counters_after(tmp_path, "before"), counters_after(tmp_path, "after")
    assert after["jemalloc.allocated"] - before["jemalloc.allocated"] > 1 * MB
    assert after["jemalloc.resident"] >= after["jemalloc.active"] >= after["jemalloc.allocated"]


def test_probe_stays_off_outside_multiprocessing_children(tmp_path: Path) -> None:
    env = {**os.environ, "ENGINE_MEMORY_PROBE_DIR": str(tmp_path), "PYTHONPATH": str(PROBE_DIR)}
    code = (
        "import tracemalloc, signal; "
        "print(tracemalloc.is_tracing(), signal.getsignal(signal.SIGUSR2) == signal.SIG_DFL)"
    )
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert result.stdout.split() == ["False", "True"]
    assert find_snapshots(tmp_path) == {}


def test_jeprof_text_is_read_into_sites_with_their_share() -> None:
    text = (
        "Using local file python.\nTotal: 4000 B\n"
        "    3000  75.0%  75.0%     3000  75.0% c10::alloc_cpu\n"
        "    1000  25.0% 100.0%     1000  25.0% _PyObject_Malloc (inline)\n"
        "       0   0.0% 100.0%     4000 100.0% Py_RunMain\n"
    )
    parsed = parse_jeprof_text(text, top=2)
    assert parsed["net_bytes"] == 4000
    assert [(s["site"], s["share_of_growth"]) for s in parsed["sites"]] == [
        ("c10::alloc_cpu", 0.75),
        ("_PyObject_Malloc (inline)", 0.25),
    ]


def heap_profile(path: Path, interval: int, stacks: dict[str, tuple[int, int]]) -> Path:
    """A jemalloc heap_v2 file: each stack's sampled objects and bytes, as jemalloc writes them."""
    lines = [f"heap_v2/{interval}", "  t*: 0: 0 [0: 0]"]
    for stack, (count, size) in stacks.items():
        lines += [f"@ {stack}", f"  t*: {count}: {size} [0: 0]", f"  t0: {count}: {size} [0: 0]"]
    path.write_text("\n".join([*lines, "", "MAPPED_LIBRARIES:", "00400000-00401000 r-xp 0 0:0 0 /x", ""]))
    return path


def test_sampling_noise_of_a_profile_diff_counts_sampled_objects_that_came_or_went(tmp_path: Path) -> None:
    """Small objects are sampled once per ~interval bytes, so each one that came or went moves
    jeprof's estimate by ~interval; with every allocation sampled there is no sampling noise."""
    same = {"0x1 0x2": (10, 1000), "0x3": (2, 200_000)}
    before = heap_profile(tmp_path / "a.heap", 32768, same)
    assert sampling_noise(before, heap_profile(tmp_path / "b.heap", 32768, same)) == 0
    four_more = heap_profile(tmp_path / "c.heap", 32768, same | {"0x1 0x2": (14, 1400)})
    assert sampling_noise(before, four_more) == pytest.approx(2 * 32768, rel=0.01)  # sqrt(4) objects
    every_allocation = heap_profile(tmp_path / "d.heap", 1, same)
    assert (
        sampling_noise(every_allocation, heap_profile(tmp_path / "e.heap", 1, same | {"0x1 0x2": (14, 1400)}))
        == 0
    )


def test_app_probe_snapshots_this_process_with_its_mappings(tmp_path: Path) -> None:
    """APP_MEMORY_PROBE_DIR: the app's own process, role `app`, its snapshots on SIGUSR2."""
    code = (
        "import os, pathlib, signal, time, gc, types, sys\n"
        "from services.observability.app_probe import start_app_probe\n"
        "def snapshot(count):\n"
        "    os.kill(os.getpid(), signal.SIGUSR2)\n"
        f"    while len(list(pathlib.Path({str(tmp_path)!r}).glob('*.tracemalloc'))) < count:\n"
        "        time.sleep(0.05)\n"
        f"start_app_probe({str(tmp_path)!r}, 3600, tracemalloc_frames=4, deep_census=True)\n"
        "class Unresolvable:  # a lazy proxy like chainlit's context: every lookup raises\n"
        "    __class__ = property(lambda self: 1 / 0)\n"
        "    def __getattr__(self, name): raise LookupError(name)\n"
        "lazy = Unresolvable()\n"
        "sys.modules['cache_owner'] = owner = types.ModuleType('cache_owner')\n"
        "owner.store = types.SimpleNamespace(words={}); gc.freeze(); snapshot(1)\n"
        "kept = [str(i) * 50 for i in range(50_000)]\n"
        "owner.store.words.update((str(i), str(-i)) for i in range(10, 310))\n"
        "snapshot(2)\n"
    )
    root = Path(__file__).resolve().parents[3]
    subprocess.run([sys.executable, "-c", code], cwd=root, timeout=SNAPSHOT_WAIT_SECONDS, check=True)
    ((role, _pid),) = find_snapshots(tmp_path)
    assert role == "app"
    (process,) = attribute(tmp_path).values()
    top = process["python"]["sites"][0]
    assert top["site"] == "<string>:14" and top["blocks"] >= 50_000
    grown = process["objects"]["containers"][0]  # the census: no tracing needed
    assert grown["type"] == "list" and grown["length"] == grown["grew_by"] == 50_000 and grown["new"]
    assert grown["hint"].startswith("'0000")
    reachable = {c["path"]: c for c in process["objects"]["reachable"]}  # from module globals
    assert reachable["__main__.kept"]["grew_by"] == 50_000
    # a dict of strings made before gc.freeze(): only the walk from module globals sees it grow
    assert reachable["cache_owner.store.words"] == {
        "path": "cache_owner.store.words",
        "length": 300,
        "grew_by": 300,
    }
    # the deep census: every reachable object, strings too, by the module global that holds it
    owners = {o["owner"]: o for o in process["objects"]["owners"]["grew"]}
    assert owners["__main__.kept"]["objects"] == 50_001  # the list and its strings
    assert owners["__main__.kept"]["types"][0] == {"type": "builtins.str", "objects": 50_000}
    words = owners["cache_owner.store"]["types"][0]  # 300 keys (gc does not see them), 300 values,
    assert words["type"] == "builtins.str" and 600 <= words["objects"] <= 601  # and "words" itself
    assert process["objects"]["owners"]["objects"] > 50_500  # all reachable objects, net
    counters = read_counters(tmp_path)[-1]
    assert counters["role"] == "app"
    assert sum(v for k, v in counters.items() if k.startswith("anonymous_bytes.")) > 1 * MB


def test_deep_census_names_the_running_task_that_holds_objects() -> None:
    """Objects only a coroutine holds are reachable from no module global: the deep census names
    the task's coroutine as their owner, not the first object gc happens to list."""

    async def holder(ready: asyncio.Event, done: asyncio.Event) -> int:
        words = [str(i) * 3 for i in range(10_000, 13_000)]
        ready.set()
        await done.wait()
        return len(words)

    async def census_while_held() -> dict[str, Any]:
        ready, done = asyncio.Event(), asyncio.Event()
        task = asyncio.create_task(holder(ready, done))
        await ready.wait()
        owners = reachable_objects()
        done.set()
        assert await task == 3_000
        return owners

    owners = asyncio.run(census_while_held())
    held = owners[f"task:{holder.__qualname__}"]
    assert held["types"]["builtins.str"][0] >= 3_000
