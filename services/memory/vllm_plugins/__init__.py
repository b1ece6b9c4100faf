"""Our workarounds for vLLM, loaded by vLLM itself in every one of its processes.

vLLM calls the functions of the `vllm.general_plugins` entry point group in
each process it runs: the app's, EngineCore and the workers. This folder is a
plugin distribution: `vllm_chat_patches-1.0.dist-info` names
`vllm_chat_patches:apply`, and `vllm_chat_patches.py` sits beside it. It needs
only the standard library, pyzmq and vLLM, because vLLM's processes may not
start in the repository's folder. `register` puts this folder on sys.path
before the engine starts; spawned processes inherit sys.path. An operator's
`VLLM_PLUGINS` list that leaves out `vllm_chat_patches` switches them off.

tests/system/engine/test_patches.py notices when an upgraded vLLM no longer needs a workaround.
"""

from __future__ import annotations

import sys
from pathlib import Path

PLUGIN_PATH = Path(__file__).resolve().parent


def register() -> None:
    """Let vLLM find `vllm_chat_patches` in this process and in the processes it spawns."""
    if str(PLUGIN_PATH) not in sys.path:
        sys.path.append(str(PLUGIN_PATH))
