"""One model of the vLLM servers (ENGINE_URLS with several models): the backend its `ChatEngine` uses.

Every model shares the servers' one `RemoteLLM` (its connection pool, load and health); this view
adds the model's name to each request, so it goes only to the servers that list that model (through
a router, the router routes by it), and the model's own tokenizer, so prompts are rendered with the
model's own chat template.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from services.engine.backends.remote.engine import RemoteLLM
from services.engine.backends.remote.protocol import Output


class RemoteModel:
    """The LLMBackend of one listed model, over the shared RemoteLLM."""

    def __init__(self, remote: RemoteLLM, name: str, tokenizer: Any) -> None:
        self.remote = remote
        self.name = name
        self._tokenizer = tokenizer

    @property
    def errored(self) -> bool:
        return self.remote.errored

    def get_tokenizer(self) -> Any:
        return self._tokenizer

    def generate(
        self, prompt: dict[str, Any], params: Any, request_id: str, *, priority: int = 0
    ) -> AsyncIterator[Output]:
        """RemoteLLM's own stream (not a wrapper around it): closing it closes the server's stream."""
        return self.remote.generate(prompt, params, request_id, priority=priority, model=self.name)

    async def abort(self, request_id: str) -> None:
        await self.remote.abort(request_id)

    def get_num_unfinished_requests(self) -> int:
        return self.remote.get_num_unfinished_requests()

    async def check_health(self) -> None:
        await self.remote.check_health()

    def shutdown(self) -> None:
        """Nothing to stop: the servers are the operators', the pool closes with the RemoteLLM."""
