"""The in-process engine: vLLM's AsyncLLM started in this process tree, and what it needs around it.

- `local_engine_lifespan(settings)`: AsyncLLM's whole life (environment for vLLM's
  spawned processes, the default model, the orphan guard), yielding a `ChatEngine`;
- vLLM's processes: `engine_processes`, `process_role`, `is_running`, `reap`, and the
  `OrphanGuard` that stops them if the app dies (`python -m
  services.engine.backends.local.processes` is that guard);
- the default model: `ensure_default_model`, `prepare_default_model` (the folder
  converted from the bundled GGUF; the remote backend reads its tokenizer too);
- the worker's thread layout: `worker_thread_bind`, `worker_thread_env`.

Names are imported on first use, so the orphan guard's process loads only its own module.
"""

from __future__ import annotations

from services import lazy_exports

# Each name outside code uses -> "module:attribute" inside this package.
_EXPORTS = {
    "RPC_DIR_PREFIX": "engine:RPC_DIR_PREFIX",
    "engine_args": "engine:engine_args",
    "local_engine_lifespan": "engine:local_engine_lifespan",
    "worker_thread_bind": "engine:worker_thread_bind",
    "worker_thread_env": "engine:worker_thread_env",
    "ensure_default_model": "model_prep:ensure_default_model",
    "prepare_default_model": "model_prep:prepare_default_model",
    "OrphanGuard": "processes:OrphanGuard",
    "engine_processes": "processes:engine_processes",
    "is_running": "processes:is_running",
    "process_role": "processes:process_role",
    "reap": "processes:reap",
}
__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
