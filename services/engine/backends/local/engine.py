"""The in-process engine: vLLM's AsyncLLM started in this process tree, and everything it needs first.

`local_engine_lifespan` is the engine's whole life in one async context:
environment for vLLM's spawned processes, the default model, AsyncLLM, the
orphan guard; on every exit path the engine is shut down,
leftover processes are stopped and the private RPC folder is removed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

from services.config import Settings
from services.engine.backends import LLMBackend
from services.engine.backends.local.model_prep import prepare_default_model
from services.engine.backends.local.processes import OrphanGuard, engine_processes, reap
from services.engine.load import EngineLoad, load_stat_logger
from services.memory import apply_engine_memory_env, forget_preload, put_env, register_vllm_plugins

logger = logging.getLogger(__name__)

ENGINE_ARG_NAMES = (
    "model",
    "dtype",
    "max_model_len",
    "max_num_seqs",
    "max_num_batched_tokens",
    "long_prefill_token_threshold",
    "block_size",
    "max_num_queued_reqs",
    "max_num_queued_tokens",
    "enable_prefix_caching",
    "enable_chunked_prefill",
    "gpu_memory_utilization",
    "swap_space",
    "enforce_eager",
    "tensor_parallel_size",
    "quantization",
    "kv_cache_dtype",
    "num_gpu_blocks_override",
)
NONE_WHEN_ZERO = ("block_size", "max_num_queued_reqs", "max_num_queued_tokens", "num_gpu_blocks_override")
RPC_DIR_PREFIX = "vllm-chat-rpc-"
ENGINE_TEMP_ENV_NAMES = ("TMPDIR", "VLLM_RPC_BASE_PATH")
ALL_CORES_UP_TO = 2  # the worker gets every core on machines this small (worker_thread_bind)
# oneDNN's global primitive cache in vLLM's CPU processes (ONEDNN_PRIMITIVE_CACHE_CAPACITY). Each new
# batch size compiles 4 matmul primitives (~1.2 MB with the default model); oneDNN's default keeps 1024
# (~300 MB), filled slowly as traffic brings new sizes. vLLM keeps its own sizes per layer in front of it.
ENGINE_ONEDNN_CACHE_CAPACITY = 16
# oneDNN matmul primitives vLLM's CPU linear layers keep per weight, one per step size (vLLM's own: 32;
# 0 = vLLM's). Large steps' primitives are large and its LRU keeps them after a peak of load: 8 kept
# ~25 MB less in the worker and no step at a burst (BENCHMARKS.md).
ENGINE_ONEDNN_MM_CACHE = 8


def engine_args(settings: Settings) -> Any:
    """vLLM AsyncEngineArgs from the settings, keeping only fields this vLLM knows."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    known = {f.name for f in dataclasses.fields(AsyncEngineArgs)}
    defaults = {f.name: f.default for f in dataclasses.fields(Settings)}
    kwargs: dict[str, Any] = {}
    for name in ENGINE_ARG_NAMES:
        value = settings.model_path if name == "model" else getattr(settings, name)
        if (name == "quantization" or name in NONE_WHEN_ZERO) and not value:
            value = None
        if name == "dtype" and value == "auto":
            value = auto_dtype()
        if name not in known:
            if value != defaults[name]:
                logger.warning("%s is not an engine option of this vLLM version; ignored", name.upper())
            continue
        kwargs[name] = value
    if "scheduling_policy" in known:  # chat before documents (services/admission picks the priorities)
        kwargs["scheduling_policy"] = "priority" if settings.priority_scheduling else "fcfs"
    return AsyncEngineArgs(**kwargs)


def auto_dtype() -> str:
    """bfloat16 where the hardware computes it natively (CUDA, AVX512-BF16/AMX CPUs), else float32.

    On an AVX2-only CPU bf16 is emulated and several times slower than float32
    (BENCHMARKS.md, dtype).
    """
    import torch

    if torch.cuda.is_available():
        return "auto"  # the model's own dtype (bf16 for most current models)
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            flags = set(cpuinfo.read().split())
    except OSError:
        flags = set()
    return "bfloat16" if flags & {"avx512_bf16", "amx_bf16"} else "float32"


def worker_thread_bind(cpus: set[int]) -> str:
    """VLLM_CPU_OMP_THREADS_BIND for the worker, given the cores this process may use.

    Up to ALL_CORES_UP_TO cores: all of them (as a cpu list). On 2 cores, bench/engine/thread_layout.py
    measured 1.5x the prefill speed and 1.4x the answers at 50 users, at a third of the time to
    first token, against vLLM's "auto", which leaves one core of two to the app and EngineCore
    (BENCHMARKS.md, "CPU thread layout"). Above it: "auto" (one core of many is a small price, and
    larger machines were not measured here).
    """
    if not cpus or len(cpus) > ALL_CORES_UP_TO:
        return "auto"
    return ",".join(str(cpu) for cpu in sorted(cpus))


def worker_thread_env(cpus: set[int]) -> dict[str, str]:
    """vLLM's thread-layout variables for `cpus` (worker_thread_bind; nothing reserved with a list)."""
    bind = worker_thread_bind(cpus)
    reserved = {} if bind == "auto" else {"VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
    return {"VLLM_CPU_OMP_THREADS_BIND": bind, **reserved}


def prepare_process_env(settings: Settings) -> None:
    """Environment vLLM's processes read when they start.

    vLLM spawns EngineCore and its workers (never forks them on CPU), so what is
    set here before AsyncLLM is created reaches them and nothing else.
    """
    # Required on CPU in practice: vLLM's default sizing from the VM's NUMA report fails.
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(settings.cpu_kvcache_space_gib)
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    # The worker's OpenMP threads: every core on small machines, vLLM's own layout on larger ones.
    # A layout set by hand is kept whole (a hand-set "auto" keeps vLLM's reserved core).
    if "VLLM_CPU_OMP_THREADS_BIND" not in os.environ:
        os.environ.update(worker_thread_env(os.sched_getaffinity(0)))
    # torch.compile's cache (vLLM compiles its CPU sampler on the first sampled request) next to the
    # model: kept across starts, out of /tmp.
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(Path(settings.cache_dir) / "torchinductor"))
    # Their malloc (glibc tuned, or jemalloc/tcmalloc preloaded) and the memory probe when asked.
    allocator = apply_engine_memory_env(settings)
    logger.info("vLLM's processes start with %s", allocator or "glibc's defaults")
    # Our workarounds for vLLM, which its processes load as a general plugin (services/memory/vllm_plugins).
    register_vllm_plugins()
    # Read by the oneDNN inside vLLM's CPU kernels when its cache is first used (in the worker).
    os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] = str(ENGINE_ONEDNN_CACHE_CAPACITY)
    # vLLM's own LRU in front of it, per weight: capped by our plugin when the worker loads the model.
    os.environ["ENGINE_ONEDNN_MM_CACHE"] = str(ENGINE_ONEDNN_MM_CACHE)


@contextlib.contextmanager
def engine_temp_folder(rpc_dir: str) -> Iterator[None]:
    """While vLLM spawns its processes, their temp files and ZMQ sockets go to our private folder.

    The folder is removed on shutdown (or by the orphan guard), and with it what vLLM
    leaves when its processes are stopped hard: socket files and the worker's
    rendezvous file (torch's FileStore, `vllm_dist_*`). Set only around the spawn, so
    this process's later children keep the usual temp folder.
    """
    tempfile.gettempdir()  # this process's own choice is made (and cached) first
    before = {name: os.environ.get(name) for name in ENGINE_TEMP_ENV_NAMES}
    os.environ.update(dict.fromkeys(ENGINE_TEMP_ENV_NAMES, rpc_dir))
    try:
        yield
    finally:
        for name, value in before.items():
            put_env(name, value)


@contextlib.asynccontextmanager
async def local_engine_lifespan(settings: Settings) -> AsyncIterator[tuple[LLMBackend, int, EngineLoad]]:
    """Start vLLM's AsyncLLM in this process tree, yield it (with its context length and the load its
    stat logger feeds), and shut it down on every exit path."""
    rpc_dir = tempfile.mkdtemp(prefix=RPC_DIR_PREFIX)
    llm = guard = None
    others = {p.pid for p in engine_processes()}  # another model's engine (MODELS): never reaped here
    mine: list[Any] = []  # psutil processes of this engine: EngineCore and its workers
    try:
        prepare_process_env(settings)
        await prepare_default_model(settings)
        from vllm.v1.engine.async_llm import AsyncLLM

        started = time.monotonic()
        load = EngineLoad()
        with engine_temp_folder(rpc_dir):
            llm = AsyncLLM.from_engine_args(engine_args(settings), stat_loggers=[load_stat_logger(load)])
        forget_preload()  # EngineCore and its worker run: later children keep their own malloc
        mine = [p for p in engine_processes() if p.pid not in others]
        guard = OrphanGuard(mine, rpc_dir)
        logger.info("engine started in %.1f s (model %s)", time.monotonic() - started, settings.model_path)
        yield llm, llm.model_config.max_model_len, load
    finally:
        children = mine or [p for p in engine_processes() if p.pid not in others]
        if llm is not None:
            llm.shutdown()
        reap(children)
        if guard is not None:
            guard.close()
        shutil.rmtree(rpc_dir, ignore_errors=True)
