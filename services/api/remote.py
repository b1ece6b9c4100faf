"""The /v1 API in ENGINE_URLS mode: requests that passed the gate go on to the vLLM servers' own /v1.

The servers speak the protocol themselves, so nothing is translated: the body is forwarded, to the
servers that list the model it names, with that server's id for the model swapped in (and the
gate's `priority` dropped for a server that does not take one) through chat's own
`RemoteLLM.open_stream` (the same server choice, retries on refused connections, connection pool
and ENGINE_MAX_CONNECTIONS bound), and the answer streams back as the server wrote it. A request
counts as in flight on its server while it runs, so chat and the API share the load picture. A
client that goes away closes the server's stream, and vLLM aborts the request.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import Callable, MutableMapping
from typing import Any

import httpx

from services.api.errors import ApiError
from services.api.server import model_name, public_listing
from services.config import Settings
from services.engine import ServedModels, UnavailableModelError, UnknownModelError
from services.engine.backends.remote import RemoteLLM, Server, ServerUnreachableError
from services.engine.backends.remote.model_view import RemoteModel
from services.engine.backends.remote.routing import model_id

Scope = MutableMapping[str, Any]
RELAYED_HEADERS = (b"content-type", b"retry-after")


class RemoteApiServer:
    """`OpenAiServer`'s place in the gate, over the vLLM servers that RemoteLLM already knows: the
    models they list now (`/v1/models`), a request sent only to the servers listing its model."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.model = model_name(settings)  # API_MODEL_NAME (or MODEL's name): the default's other name
        self.ready = False
        self.models: ServedModels | None = None
        self.remote: RemoteLLM | None = None

    async def start(self, engine_client: ServedModels) -> None:
        self.models = engine_client
        backend = engine_client.default.backend
        self.remote = backend.remote if isinstance(backend, RemoteModel) else backend  # type: ignore[assignment]
        self.ready = True

    async def stop(self) -> None:
        self.ready = False

    async def app(self, scope: Scope, receive: Callable, send: Callable) -> None:
        """The ASGI app the gate calls: /v1/models answered here, generation forwarded."""
        assert self.remote is not None
        if scope["method"] == "GET":
            await send_json(send, 200, self.models_card())
            return
        body = json.loads((await receive())["body"])
        name = self.resolve(body.get("model"))
        request_id = f"api-{uuid.uuid4().hex}"
        server, response = await self._open(scope["path"], body, request_id, name)
        try:
            await relay(response, receive, send)
        finally:
            server.in_flight.discard(request_id)

    def resolve(self, requested: object) -> str:
        """The offered model a request names: its name, a server's id for it, or the default's other
        name; 404 model_not_found for others, 503 for a model whose servers went away."""
        assert self.models is not None and self.remote is not None
        ids = {card.id: name for s in self.remote.servers for name, card in s.models.items()}
        if requested == self.model and requested not in self.models.known:
            requested = ""
        try:
            return self.models.resolve(
                ids.get(requested, requested) if isinstance(requested, str) else requested
            )
        except UnavailableModelError as error:
            raise ApiError(503, str(error), "model_unavailable", "model", retry_after_seconds=10) from None
        except UnknownModelError as error:
            raise ApiError(404, str(error), "model_not_found", "model") from None

    def models_card(self) -> dict[str, Any]:
        assert self.models is not None and self.remote is not None
        created = int(time.time())
        cards = [
            {
                "id": name,
                "object": "model",
                "created": created,
                "owned_by": "vllm",
                "max_model_len": self.models.engine(name).max_model_len,
            }
            for name in self.models.names
        ]
        return public_listing({"object": "list", "data": cards})  # a server's id may be its path

    async def _open(
        self, path: str, body: dict[str, Any], request_id: str, name: str
    ) -> tuple[Server, httpx.Response]:
        assert self.remote is not None

        def body_for(server: Server) -> dict[str, Any]:
            forwarded = {**body, "model": model_id(server, name)}
            if not server.accepts_priority:
                forwarded.pop("priority", None)
            return forwarded

        try:
            return await self.remote.open_stream(path, body_for, request_id, model=name)
        except ServerUnreachableError:
            raise ApiError(
                503,
                "No vLLM server behind this service is reachable; try again shortly.",
                "unavailable",
                retry_after_seconds=10,
            ) from None


async def relay(response: httpx.Response, receive: Callable, send: Callable) -> None:
    """Stream the server's answer to the client; a client that leaves closes the server's stream."""

    async def client_gone() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.create_task(client_gone())
    try:
        headers = [(k, v) for k, v in response.headers.raw if k.lower() in RELAYED_HEADERS]
        await send({"type": "http.response.start", "status": response.status_code, "headers": headers})
        chunks = response.aiter_raw()
        while not watcher.done():
            next_chunk = asyncio.ensure_future(anext(chunks, b""))
            await asyncio.wait({next_chunk, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if not next_chunk.done():
                next_chunk.cancel()
                break
            chunk = next_chunk.result()
            if not chunk:
                break
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        if not watcher.done():
            await send({"type": "http.response.body", "body": b"", "more_body": False})
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
        await response.aclose()  # mid-answer: the server sees its client leave and aborts


async def send_json(send: Callable, status: int, document: dict[str, Any]) -> None:
    body = json.dumps(document).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})
