"""Memory tuning: how the app's and vLLM's processes allocate, and the caches that would grow unbounded.

- allocators (`allocators.py`): the malloc of vLLM's processes (ENGINE_ALLOCATOR: glibc
  tuned, or jemalloc/tcmalloc preloaded) set before they spawn (`apply_engine_memory_env`,
  `forget_preload`), and the app's own (APP_ALLOCATOR), which the launcher
  (`python -m services.web.launch`) sets before `chainlit run` (`app_memory_env`);
- cache bounds: the tokenizer's word caches in every copy vLLM's pool makes
  (`WordCacheBound`), numpy's small-buffer cache filled at start (`settle_native_caches`);
- the memory probe (`probe/`): allocator counters, object censuses, tracemalloc and
  jemalloc snapshots, in vLLM's processes (as their `sitecustomize`, from the folder
  `PROBE_DIR` put on their PYTHONPATH) and in the app (`start_probe`);
- our workarounds for vLLM (`vllm_plugins/`), a plugin distribution vLLM loads in each of
  its processes once `register_vllm_plugins` put its folder, `VLLM_PLUGIN_PATH`, on sys.path.

Measuring and reporting memory (samples, the leak alarm, attribution) is services/observability's.
Names are imported on first use: the launcher loads only the allocators.
"""

from __future__ import annotations

from services import lazy_exports

# Each name outside code uses -> "module:attribute" inside this package.
_EXPORTS = {
    "ENGINE_MMAP_THRESHOLD_BYTES": "allocators:ENGINE_MMAP_THRESHOLD_BYTES",
    "PRELOAD_LIBRARIES": "allocators:PRELOAD_LIBRARIES",
    "PROBE_DIR": "allocators:PROBE_DIR",
    "app_memory_env": "allocators:app_memory_env",
    "apply_engine_memory_env": "allocators:apply_engine_memory_env",
    "engine_memory_env": "allocators:engine_memory_env",
    "find_library": "allocators:find_library",
    "forget_preload": "allocators:forget_preload",
    "put_env": "allocators:put_env",
    "fill_numpy_buffer_cache": "native_caches:fill_numpy_buffer_cache",
    "settle_native_caches": "native_caches:settle_native_caches",
    "glibc_counters": "probe.allocator_counters:glibc_counters",
    "jemalloc_counters": "probe.allocator_counters:jemalloc_counters",
    "pymalloc_counters": "probe.allocator_counters:pymalloc_counters",
    "start_probe": "probe.sitecustomize:start",
    "VLLM_PLUGIN_PATH": "vllm_plugins:PLUGIN_PATH",
    "register_vllm_plugins": "vllm_plugins:register",
    "TOKENIZER_WORD_CACHE": "word_caches:TOKENIZER_WORD_CACHE",
    "WordCacheBound": "word_caches:WordCacheBound",
    "bound_tokenizer_word_cache": "word_caches:bound_tokenizer_word_cache",
}
__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
