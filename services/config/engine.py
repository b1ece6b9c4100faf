"""Engine settings: names as in vLLM's AsyncEngineArgs, plus the remote-server mode."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from services.config.fields import setting

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
ENGINE_ALLOCATORS = ("glibc", "jemalloc", "tcmalloc")
# The most models read from one vLLM server's /v1/models (the rest are ignored), and so the most MODELS
# may name with ENGINE_URLS: a bound on what a server may make this app hold, far above real listings.
ENGINE_MODELS_MAX = 32


def default_cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return str(Path(base) / "vllm-chat")


@dataclass(frozen=True)
class EngineSettings:
    """The in-process vLLM engine, or the vLLM servers that replace it (ENGINE_URLS)."""

    model: str = setting(
        "", "MODEL", "Model folder or id vLLM loads; empty = bundled SmolLM2-135M-Instruct.", tier="essential"
    )
    models: str = setting(
        "",
        "MODELS",
        "Comma-separated model folders (or ids) served side by side in this process, each picked per "
        "conversation (the chat's model menu, `model` in /v1) under its folder's name; the first is "
        "the default. Each starts its own EngineCore and worker (~2 GB more memory even for the tiny "
        "test model, bench/results/engine/): at most MAX_IN_PROCESS_MODELS. Empty = MODEL alone. With "
        "ENGINE_URLS: the models of the servers offered, in this order (each a served name, or a "
        "folder or id whose last part is one, which then gives its tokenizer); empty = all they list.",
        tier="essential",
    )
    max_in_process_models: int = setting(
        2,
        "MAX_IN_PROCESS_MODELS",
        "Most models MODELS may list: each adds a whole engine (its processes, weights and "
        "VLLM_CPU_KVCACHE_SPACE of KV: two tiny models took the tree from 0.8 to 4.8 GB) to this "
        "machine's memory, and their workers share its cores (starts take longer one after another).",
        1,
    )
    dtype: str = setting(
        "auto",
        "DTYPE",
        "Weights/activations dtype; auto = bfloat16 on GPUs and bf16-capable CPUs, else float32.",
    )
    max_model_len: int = setting(
        8192, "MAX_MODEL_LEN", "Context window in tokens (prompt + answer).", 16, tier="essential"
    )
    max_num_seqs: int = setting(64, "MAX_NUM_SEQS", "Sequences batched together at most.", 1)
    max_num_batched_tokens: int = setting(
        2048,
        "MAX_NUM_BATCHED_TOKENS",
        "Tokens per engine step: long prompts are prefilled in pieces this size, so other "
        "streams keep flowing while a document is read.",
        16,
    )
    long_prefill_token_threshold: int = setting(
        128,
        "LONG_PREFILL_TOKEN_THRESHOLD",
        "vLLM's cap on the prompt tokens one request prefills per engine step: a document is read "
        "in pieces this size, so a step, and the pause it puts on every running stream and on a chat "
        "turn's first token, stays short. 0 = up to MAX_NUM_BATCHED_TOKENS.",
        0,
    )
    block_size: int = setting(
        32,
        "BLOCK_SIZE",
        "Tokens per KV-cache block, the unit of prefix caching: a follow-up re-reads the partial block "
        "at the end of the cached prefix (a document, the history) and everything after it. 32 "
        "re-read a repeated 512-token prompt in 61 ms against 153 ms at vLLM's CPU default of 128, "
        "for ~4% less throughput (BENCHMARKS.md). 0 = vLLM's default; the CPU backend wants multiples "
        "of 32.",
        0,
    )
    max_num_queued_reqs: int = setting(
        128,
        "MAX_NUM_QUEUED_REQS",
        "vLLM's own admission control: requests the engine holds (running + waiting) at most; "
        "beyond it vLLM refuses (QueueOverflowError, 503 on servers) and the user is told the "
        "service is busy. 0 = no limit.",
        0,
    )
    max_num_queued_tokens: int = setting(
        0,
        "MAX_NUM_QUEUED_TOKENS",
        "vLLM's own admission control: prompt tokens waiting for prefill at most "
        "(MaxQueuedTokensError). 0 = no limit: the check is global and would refuse chat turns "
        "behind a document's prefill, which our queue already orders chat-first.",
        0,
    )
    enable_prefix_caching: bool = setting(
        True, "ENABLE_PREFIX_CACHING", "Reuse KV of shared prompt prefixes (history, documents)."
    )
    enable_chunked_prefill: bool = setting(
        True, "ENABLE_CHUNKED_PREFILL", "Split long prompts so decoding streams keep flowing."
    )
    gpu_memory_utilization: float = setting(
        0.9, "GPU_MEMORY_UTILIZATION", "Share of GPU memory vLLM may use (CUDA only).", 0.01
    )
    swap_space: float = setting(4.0, "SWAP_SPACE", "CPU swap space per GPU in GiB (CUDA only).", 0)
    enforce_eager: bool = setting(
        True, "ENFORCE_EAGER", "Skip torch.compile and CUDA graphs: the engine starts much sooner."
    )
    tensor_parallel_size: int = setting(1, "TENSOR_PARALLEL_SIZE", "GPUs per model replica.", 1)
    quantization: str = setting(
        "", "QUANTIZATION", "Quantization method (awq, gptq, fp8, ...); empty = none."
    )
    kv_cache_dtype: str = setting("auto", "KV_CACHE_DTYPE", "KV cache dtype (auto, fp8, ...).")
    cpu_kvcache_space_gib: int = setting(
        1, "VLLM_CPU_KVCACHE_SPACE", "KV-cache size in GiB on CPU (vLLM's own variable).", 1
    )
    num_gpu_blocks_override: int = setting(
        0,
        "KV_CACHE_BLOCKS",
        "KV-cache blocks vLLM allocates whatever the memory (vLLM's num_gpu_blocks_override); "
        "0 = as many as VLLM_CPU_KVCACHE_SPACE (or GPU_MEMORY_UTILIZATION) holds.",
        0,
    )
    engine_allocator: str = setting(
        "jemalloc",
        "ENGINE_ALLOCATOR",
        "malloc of vLLM's processes (EngineCore and the worker, not the app): glibc, jemalloc or "
        "tcmalloc; jemalloc kept the least per request in the churn bench (BENCHMARKS.md). "
        "jemalloc and tcmalloc are Debian's libjemalloc2 and libtcmalloc-minimal4, "
        "installed by scripts/setup.sh and preloaded (LD_PRELOAD) into those processes only; when "
        "the library is missing the engine starts on glibc with a warning.",
    )
    engine_malloc_arena_max: int = setting(
        0,
        "ENGINE_MALLOC_ARENA_MAX",
        "glibc's MALLOC_ARENA_MAX in vLLM's processes (with ENGINE_ALLOCATOR=glibc); 0 = glibc's "
        "default (8 per core).",
        0,
    )
    engine_jemalloc_conf: str = setting(
        "background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0",
        "ENGINE_JEMALLOC_CONF",
        "MALLOC_CONF of vLLM's processes with ENGINE_ALLOCATOR=jemalloc: free pages go back to the "
        "OS after dirty_decay_ms, by a background thread rather than inside the engine's steps.",
    )
    app_allocator: str = setting(
        "glibc",
        "APP_ALLOCATOR",
        "malloc of the app's own process (Chainlit, the chat, the data layer): glibc, jemalloc or "
        "tcmalloc. A process's malloc is fixed when it starts, so `python -m services.web.launch` "
        "(what scripts/run.sh, the Dockerfile and the tests run) preloads it before `chainlit run`; "
        "a missing library starts the app on glibc with a warning.",
    )
    app_jemalloc_conf: str = setting(
        "background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0",
        "APP_JEMALLOC_CONF",
        "MALLOC_CONF of the app's process with APP_ALLOCATOR=jemalloc.",
    )
    app_malloc_arena_max: int = setting(
        2,
        "APP_MALLOC_ARENA_MAX",
        "glibc's MALLOC_ARENA_MAX in the app's process (with APP_ALLOCATOR=glibc), applied by "
        "`python -m services.web.launch`: with glibc's default the free space inside the heaps "
        "of the app's threads spread for hours; with 2 the app stayed flat after the warm-up "
        "(BENCHMARKS.md, memory soak). 0 = glibc's default (8 per core).",
        0,
    )
    cache_dir: str = setting(
        default_cache_dir(), "CACHE_DIR", "The prepared default model and the warm-up's speeds are kept here."
    )
    warm_up_reuse_hours: float = setting(
        24.0,
        "WARM_UP_REUSE_HOURS",
        "A restart with the same model files, engine options, versions, CPU and cores takes the decode "
        "speeds a warm-up measured this recently (kept in CACHE_DIR) instead of measuring them again; "
        "every batch size still runs once, with short answers, to prepare its kernels. Admission "
        "corrects the speeds from live decoding either way. 0 = measure at every start.",
        0,
    )

    # --- remote engine: vLLM servers instead of the in-process engine -----------
    engine_urls: str = setting(
        "",
        "ENGINE_URLS",
        "Comma-separated base URLs of `vllm serve` servers (e.g. http://10.0.0.5:8000); empty = the "
        "in-process engine. The models offered are those the servers list at /v1/models (see "
        "MODELS), each under its id's last part, with its own tokenizer and context window (README, "
        "Model choice); engine options are the servers' own. A conversation "
        "stays on the server holding its prefix (ENGINE_AFFINITY), else requests go to the healthy "
        "server with the fewest of ours in flight; a server that refuses the connection is skipped.",
        tier="essential",
    )
    engine_router: bool = setting(
        False,
        "ENGINE_ROUTER",
        "ENGINE_URLS names one router in front of the vLLM servers (vLLM's router, production-stack's "
        "router, an llm-d gateway), which routes: each request carries its conversation's key "
        "(X-Session-Id) and its person's (X-User-Id, X-Gateway-Inference-Fairness-Id), hashed; our "
        "own affinity is off; admission reads the load of the servers the router lists at "
        "/list_workers (else the router's own /metrics).",
    )
    engine_affinity: bool = setting(
        True,
        "ENGINE_AFFINITY",
        "With ENGINE_URLS: send a request to the server that served its prompt's prefix (the "
        "conversation's history, its document), whose prefix cache still holds it. false = by load only.",
    )
    engine_models_refresh_seconds: float = setting(
        30.0,
        "ENGINE_MODELS_REFRESH_SECONDS",
        "With ENGINE_URLS: seconds between two readings of the servers' /v1/models. A model is offered "
        "while a server that answered the last reading lists it; one listed for the first time is "
        "offered from the next reading.",
        1,
    )
    engine_connect_timeout_seconds: float = setting(
        10.0, "ENGINE_CONNECT_TIMEOUT_SECONDS", "Seconds to open a connection to a vLLM server.", 0.1
    )
    engine_max_connections: int = setting(
        256,
        "ENGINE_MAX_CONNECTIONS",
        "Open streams to the vLLM servers at most (one per request in flight); more requests wait.",
        1,
    )
    engine_stream_timeout_seconds: float = setting(
        600.0,
        "ENGINE_STREAM_TIMEOUT_SECONDS",
        "Seconds a vLLM server's stream may stay silent (a long prompt queued behind others) before "
        "the turn fails.",
        1,
    )

    @property
    def engine_affinity_on(self) -> bool:
        """Our own prefix affinity routes: asked for, and no router does it instead."""
        return self.engine_affinity and not self.engine_router

    @property
    def engine_url_list(self) -> list[str]:
        """ENGINE_URLS as a list (empty: the in-process engine)."""
        return [url.strip() for url in self.engine_urls.split(",") if url.strip()]

    @property
    def model_list(self) -> list[str]:
        """MODELS as a list (empty: MODEL alone)."""
        return [path.strip() for path in self.models.split(",") if path.strip()]

    @property
    def model_path(self) -> str:
        """What vLLM loads: MODEL, else the first of MODELS, else the prepared default model's folder."""
        first = self.model_list[0] if self.model_list else ""
        return self.model or first or str(Path(self.cache_dir) / "models" / DEFAULT_MODEL_NAME)
