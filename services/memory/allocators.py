"""The malloc of vLLM's processes and of the app: glibc tuned, or jemalloc/tcmalloc preloaded; the probe.

Everything `engine_memory_env` returns becomes environment of EngineCore and
its worker: vLLM spawns them (never forks them on CPU), so what is set before
AsyncLLM is created reaches them at start. The app's own process keeps the
malloc it started with: `app_memory_env` is for the launcher
(services/web/launch.py), which sets it before `chainlit run`. The libraries
are Debian's packages, installed by `scripts/setup.sh`; a missing one falls
back to glibc with a warning.
"""

from __future__ import annotations

import json
import logging
import os
import sysconfig
from pathlib import Path

from services.config import Settings

logger = logging.getLogger(__name__)

PRELOAD_LIBRARIES = {"jemalloc": "libjemalloc.so.2", "tcmalloc": "libtcmalloc_minimal.so.4"}
DEBIAN_PACKAGES = {"jemalloc": "libjemalloc2", "tcmalloc": "libtcmalloc-minimal4"}
LIBRARY_DIRS = ("/usr/lib/{multiarch}", "/lib/{multiarch}", "/usr/lib64", "/usr/lib", "/usr/local/lib")
PRELOAD_ENV_NAMES = ("LD_PRELOAD", "MALLOC_CONF")
# What `app_memory_env` may set for the app's process.
LAUNCHER_ENV_NAMES = (*PRELOAD_ENV_NAMES, "MALLOC_ARENA_MAX")
# Set by `app_memory_env` in the app's environment: LAUNCHER_ENV_NAMES as they were before (JSON).
LAUNCHER_SAVED_ENV = "APP_MALLOC_ENV_BEFORE"
# The folder holding the probe's sitecustomize.py, put first on the engine processes' PYTHONPATH.
PROBE_DIR = Path(__file__).resolve().parent / "probe"
# glibc's MALLOC_MMAP_THRESHOLD_ in vLLM's processes (with ENGINE_ALLOCATOR=glibc): blocks this size and up
# are mmapped and returned to the OS when freed. glibc's own threshold drifts up to 32 MB, after which
# tensors of varying length pile up in a heap that never shrinks.
ENGINE_MMAP_THRESHOLD_BYTES = 128 * 1024
# Variables this module may set; the rest of the environment is left alone.
MEMORY_ENV_NAMES = (
    "LD_PRELOAD",
    "MALLOC_CONF",
    "MALLOC_ARENA_MAX",
    "MALLOC_MMAP_THRESHOLD_",
    "PYTHONPATH",
    "ENGINE_MEMORY_PROBE_DIR",
    "ENGINE_MEMORY_PROBE_SECONDS",
    "ENGINE_MEMORY_PROBE_FRAMES",
)


def find_library(file_name: str) -> Path | None:
    """The installed shared library `file_name` in the system's library folders, or None."""
    multiarch = sysconfig.get_config_var("MULTIARCH") or ""
    for pattern in LIBRARY_DIRS:
        candidate = Path(pattern.format(multiarch=multiarch)) / file_name
        if candidate.is_file():
            return candidate
    return None


def allocator_in_use(settings: Settings, role: str = "engine") -> tuple[str, Path | None]:
    """(allocator, library to preload) for the engine's processes or the app's ("app"): the
    configured one, or glibc when its library is missing."""
    name = settings.app_allocator if role == "app" else settings.engine_allocator
    if name == "glibc":
        return name, None
    library = find_library(PRELOAD_LIBRARIES[name])
    if library is None:
        logger.warning(
            "%s_ALLOCATOR=%s but %s is not installed (Debian: apt-get install %s, or run "
            "scripts/setup.sh); %s glibc",
            role.upper(),
            name,
            PRELOAD_LIBRARIES[name],
            DEBIAN_PACKAGES[name],
            "the app uses" if role == "app" else "vLLM's processes use",
        )
        return "glibc", None
    return name, library


def app_memory_env(settings: Settings, environ: dict[str, str] | None = None) -> dict[str, str]:
    """The variables that start the app's process on APP_ALLOCATOR (and APP_MALLOC_ARENA_MAX), and
    LAUNCHER_SAVED_ENV: what they were before, which the engine's processes and later children get."""
    environ = dict(os.environ if environ is None else environ)
    if LAUNCHER_SAVED_ENV in environ:  # launched already (a launcher starting a launcher)
        return {}
    name, library = allocator_in_use(settings, "app")
    env: dict[str, str] = {}
    if library is not None:
        preloaded = [part for part in environ.get("LD_PRELOAD", "").split(":") if part]
        env["LD_PRELOAD"] = ":".join([str(library), *[p for p in preloaded if p != str(library)]])
    if name == "jemalloc" and settings.app_jemalloc_conf:
        env["MALLOC_CONF"] = settings.app_jemalloc_conf
    if name == "glibc" and settings.app_malloc_arena_max:
        env["MALLOC_ARENA_MAX"] = str(settings.app_malloc_arena_max)
    if env:
        saved = {variable: environ.get(variable) for variable in LAUNCHER_ENV_NAMES}
        env[LAUNCHER_SAVED_ENV] = json.dumps(saved)
    return env


def environment_before_launcher() -> dict[str, str | None]:
    """LAUNCHER_ENV_NAMES as they were before `app_memory_env` set the app's malloc."""
    saved = json.loads(os.environ.get(LAUNCHER_SAVED_ENV) or "{}")
    return {name: saved[name] if name in saved else os.environ.get(name) for name in LAUNCHER_ENV_NAMES}


def engine_memory_env(settings: Settings, environ: dict[str, str] | None = None) -> dict[str, str]:
    """The variables to set for vLLM's processes: allocator, its tuning, and the memory probe."""
    environ = dict(os.environ if environ is None else environ)
    name, library = allocator_in_use(settings)
    env: dict[str, str] = {}
    if library is not None:
        preloaded = [part for part in environ.get("LD_PRELOAD", "").split(":") if part]
        env["LD_PRELOAD"] = ":".join([str(library), *[p for p in preloaded if p != str(library)]])
    if name == "jemalloc" and settings.engine_jemalloc_conf:
        env["MALLOC_CONF"] = settings.engine_jemalloc_conf
    if name == "glibc":
        # Their glibc reads these at start (the app's own heap is unaffected).
        env["MALLOC_MMAP_THRESHOLD_"] = str(ENGINE_MMAP_THRESHOLD_BYTES)
        if settings.engine_malloc_arena_max:
            env["MALLOC_ARENA_MAX"] = str(settings.engine_malloc_arena_max)
    if settings.engine_memory_probe_dir:
        Path(settings.engine_memory_probe_dir).mkdir(parents=True, exist_ok=True)
        paths = [str(PROBE_DIR), *[p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p]]
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
        env["ENGINE_MEMORY_PROBE_DIR"] = str(Path(settings.engine_memory_probe_dir).resolve())
        env["ENGINE_MEMORY_PROBE_SECONDS"] = str(settings.engine_memory_probe_seconds)
        env["ENGINE_MEMORY_PROBE_FRAMES"] = str(settings.engine_memory_probe_frames)
    return env


def apply_engine_memory_env(settings: Settings) -> dict[str, str]:
    """Set `engine_memory_env` in os.environ over what was there before the first engine; return it.

    Bench and test processes start several engines in turn with different
    allocators: each start begins from the environment as it was before ours.
    """
    before_launcher = environment_before_launcher()
    for name in MEMORY_ENV_NAMES:
        _before_us.setdefault(name, before_launcher.get(name, os.environ.get(name)))
    base = {**os.environ, **{k: v for k, v in _before_us.items() if v is not None}}
    for name, value in _before_us.items():
        if value is None:
            base.pop(name, None)
    env = engine_memory_env(settings, base)
    for name in MEMORY_ENV_NAMES:
        put_env(name, env.get(name, base.get(name)))
    return env


def forget_preload() -> None:
    """Once vLLM's processes run: LD_PRELOAD and MALLOC_CONF back to what they were before us.

    They are for EngineCore and its worker only; left in os.environ, every later child of this
    process (a browser in the tests, the plot process, initdb) would start on the engine's malloc,
    and Chromium does not start with jemalloc preloaded.
    """
    for name in PRELOAD_ENV_NAMES:
        put_env(name, _before_us.get(name, os.environ.get(name)))


def put_env(name: str, value: str | None) -> None:
    """Set `name` in os.environ, or remove it when `value` is None."""
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


_before_us: dict[str, str | None] = {}  # the memory variables as they were before the first engine
