"""The engines under `ChatEngine`, and `LLMBackend`: the one interface both satisfy.

- `local`: vLLM's AsyncLLM in this process tree (its processes, their guard, the default model);
- `remote`: vLLM servers (ENGINE_URLS), through `RemoteLLM`.

`ChatEngine` is written against this protocol only, so the chat layer never
knows whether the model runs in this process tree or on another machine.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Protocol

__all__ = ["LLMBackend"]


class LLMBackend(Protocol):
    """The part of vLLM's `AsyncLLM` that `ChatEngine` uses."""

    @property
    def errored(self) -> bool:
        """True once the engine can no longer serve (its process died)."""
        ...

    def generate(
        self, prompt: Any, sampling_params: Any, request_id: str, *, priority: int = 0
    ) -> AsyncIterator[Any]:
        """Stream `RequestOutput`-shaped deltas for one request (lower `priority` is scheduled earlier)."""
        ...

    async def abort(self, request_id: str) -> None:
        """Stop a request and free what the engine holds for it."""
        ...

    def get_num_unfinished_requests(self) -> int: ...

    async def check_health(self) -> None:
        """Raise when the engine is dead."""
        ...

    def get_tokenizer(self) -> Any: ...

    def shutdown(self) -> None: ...
