"""The /v1 API over several in-process models (MODELS): one vLLM serving layer per model, a request
sent to the one its `model` names.

Each model gets its own `OpenAiServer` (vLLM's layer over that model's engine, with its own chat
template and context length). `/v1/models` lists every served model; a generating request goes to the
model it names (none: the default), and a name that is not served gets OpenAI's 404
`model_not_found`, listing what is. The gate (gate.py) has already read and checked the body.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, MutableMapping
from typing import Any

from services.api.errors import ApiError
from services.api.server import OpenAiServer, public_listing
from services.config import Settings
from services.engine import ServedModels, UnknownModelError
from services.engine.models import model_settings

Scope = MutableMapping[str, Any]


class ModelsServer:
    """`OpenAiServer`'s place in the gate when several models are served."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.servers = {name: OpenAiServer(own) for name, own in model_settings(settings)}
        self.model = next(iter(self.servers))
        self.ready = False
        self.models: ServedModels | None = None

    async def start(self, engine_client: ServedModels) -> None:
        self.models = engine_client
        for name, engine in engine_client:
            await self.servers[name].start(engine.backend)
        self.ready = True

    async def stop(self) -> None:
        self.ready = False
        for server in self.servers.values():
            await server.stop()

    async def app(self, scope: Scope, receive: Callable, send: Callable) -> None:
        """The ASGI app the gate calls: /v1/models answered here, generation sent to its model's layer."""
        assert self.models is not None
        if scope["method"] == "GET":
            await _send_json(send, 200, self.models_card())
            return
        message = await receive()
        body = message.get("body", b"")
        try:
            requested = json.loads(body).get("model")
            name = self.models.resolve(requested)
        except UnknownModelError as error:
            raise ApiError(404, str(error), "model_not_found", "model") from None
        await self.servers[name].app(scope, _replay(message, receive), send)

    def models_card(self) -> dict[str, Any]:
        assert self.models is not None
        created = int(time.time())
        cards = [
            {
                "id": name,
                "object": "model",
                "created": created,
                "owned_by": "vllm",
                "max_model_len": engine.max_model_len,
            }
            for name, engine in self.models
        ]
        return public_listing({"object": "list", "data": cards})


def _replay(first: dict[str, Any], receive: Callable) -> Callable:
    """A `receive` that gives the message already read once, then the client's own."""
    pending = [first]

    async def replayed() -> dict[str, Any]:
        return pending.pop() if pending else await receive()

    return replayed


async def _send_json(send: Callable, status: int, payload: dict[str, Any]) -> None:
    body = json.dumps(payload).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
