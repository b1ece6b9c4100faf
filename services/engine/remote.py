"""vLLM servers as the engine: the part of AsyncLLM that ChatEngine uses, over HTTP.

When one machine is not enough, operators run vLLM's own OpenAI-compatible
servers (`vllm serve`, with tensor/pipeline parallelism and multi-node) and set
ENGINE_URLS. `RemoteLLM` then stands where the in-process `AsyncLLM` stood:
`ChatEngine` keeps the chat template, token budgets, streaming and aborts, and
sends token ids to `/v1/completions`. Each request goes to the healthy server
with the fewest of our requests in flight; when a server refuses the
connection, the next one gets the request. Closing a stream closes its HTTP
response, and vLLM aborts a request whose client went away, so no KV cache
outlives its reader on the server either.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from services.config import Settings
from services.engine.chat_engine import ChatEngine
from services.engine.errors import EngineUnavailableError
from services.engine.model_prep import prepare_default_model

logger = logging.getLogger(__name__)


class RemoteEngineError(RuntimeError):
    """A vLLM server refused or failed a request."""


class ServerUnreachableError(EngineUnavailableError):
    """No vLLM server could be reached (users see "the model is not available")."""


@dataclass
class Completion:
    """One streamed delta, shaped like vLLM's `CompletionOutput` where ChatEngine reads it."""

    text: str
    token_ids: list[int]
    finish_reason: str | None


@dataclass
class Output:
    """One streamed chunk, shaped like vLLM's `RequestOutput` where ChatEngine reads it."""

    outputs: list[Completion]
    finished: bool
    metrics: None = None  # queue time is measured inside the server, not reported over HTTP


@dataclass
class Server:
    """One vLLM server and what this app knows about it."""

    url: str
    model: str = ""
    max_model_len: int = 0
    healthy: bool = True
    in_flight: set[str] = field(default_factory=set)  # ids of our requests it is serving


def parse_event(line: str) -> dict[str, Any] | None:
    """The JSON of one server-sent-events `data:` line; None for other lines and `[DONE]`."""
    if not line.startswith("data:"):
        return None
    payload = line[len("data:") :].strip()
    if not payload or payload == "[DONE]":
        return None
    return json.loads(payload)


def completion_body(model: str, prompt_ids: list[int], params: Any) -> dict[str, Any]:
    """The /v1/completions body for a SamplingParams: token ids in, text and token ids out."""
    return {
        "model": model,
        "prompt": prompt_ids,
        "max_tokens": params.max_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "frequency_penalty": getattr(params, "frequency_penalty", 0.0),
        "repetition_penalty": getattr(params, "repetition_penalty", 1.0),  # vLLM's extension of the API
        "stream": True,
        "return_token_ids": True,
    }


def chunk_output(event: dict[str, Any]) -> Output:
    """An Output from one streamed completion chunk; an error event raises."""
    if "error" in event or not event.get("choices"):
        detail = event.get("error") or event
        message = detail.get("message", detail) if isinstance(detail, dict) else detail
        raise RemoteEngineError(f"the vLLM server failed the request: {message}")
    choice = event["choices"][0]
    finish_reason = choice.get("finish_reason")
    token_ids = list(choice.get("token_ids") or [])
    completion = Completion(choice.get("text") or "", token_ids, finish_reason)
    return Output([completion], finished=finish_reason is not None)


def servers_to_try(servers: list[Server]) -> list[Server]:
    """Every server, best first: healthy before failing, then fewest of our requests in flight.

    Failing servers are still tried, last: a failure is per request, and a
    server that came back is found by trying it.
    """
    return sorted(servers, key=lambda s: (not s.healthy, len(s.in_flight)))


def unreachable(server: Server, what: str, error: Exception) -> ServerUnreachableError:
    """Mark `server` as failing (others are tried first until it answers again); the error to raise."""
    server.healthy = False
    return ServerUnreachableError(f"vLLM server {server.url} {what}: {type(error).__name__}: {error}")


class RemoteLLM:
    """AsyncLLM's methods that ChatEngine calls, served by one or more vLLM servers."""

    def __init__(
        self,
        urls: list[str],
        tokenizer: Any,
        connect_timeout: float,
        idle_timeout: float,
        max_connections: int,
    ) -> None:
        self.servers = [Server(url.rstrip("/")) for url in urls]
        self._tokenizer = tokenizer
        # One stream is one connection: more requests than the pool holds wait for
        # a free one. A stream may sit silent for `idle_timeout` while a long
        # prompt is prefilled behind others.
        timeout = httpx.Timeout(idle_timeout, connect=connect_timeout)
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        self._client = httpx.AsyncClient(timeout=timeout, limits=limits)
        self._probe_timeout = connect_timeout
        self._responses: dict[str, httpx.Response] = {}  # open streams; each removes itself

    async def connect(self) -> None:
        """Learn each server's model and context window; fail unless all of them answer."""
        for server in self.servers:
            try:
                response = await self._client.get(f"{server.url}/v1/models")
                response.raise_for_status()
                card = response.json()["data"][0]
            except (httpx.HTTPError, KeyError, IndexError, ValueError) as error:
                message = f"vLLM server {server.url} did not list a model: {error}"
                raise ServerUnreachableError(message) from error
            server.model, server.max_model_len = card["id"], int(card.get("max_model_len") or 0)
        lengths = {s.max_model_len for s in self.servers}
        models = {s.model for s in self.servers}
        if len(models) > 1:
            raise RemoteEngineError(f"ENGINE_URLS serve different models: {sorted(models)}")
        logger.info("vLLM servers %s serve %s (context %s)", [s.url for s in self.servers], models, lengths)

    @property
    def max_model_len(self) -> int:
        """The smallest context window among the servers (a request may land on any)."""
        return min(s.max_model_len for s in self.servers)

    @property
    def errored(self) -> bool:
        """Never: nothing runs here that can die; failures are per request, /healthz probes the servers."""
        return False

    def get_tokenizer(self) -> Any:
        return self._tokenizer

    async def generate(self, prompt: dict[str, Any], params: Any, request_id: str) -> AsyncIterator[Output]:
        """Stream one request's deltas from the least busy healthy server that takes it."""
        server, response = await self._open_stream(list(prompt["prompt_token_ids"]), params, request_id)
        try:
            self._responses[request_id] = response
            try:
                if response.status_code != 200:
                    await response.aread()
                    detail = response.text[:300]
                    raise RemoteEngineError(f"vLLM server answered {response.status_code}: {detail}")
                # Held here until the response is closed: dropping httpx's nested line
                # iterators first lets the garbage collector half-close the connection,
                # after which aclose() does nothing and the server keeps generating.
                lines = response.aiter_lines()
                try:
                    async for line in lines:
                        event = parse_event(line)
                        if event is not None:
                            yield chunk_output(event)
                except httpx.TransportError as error:  # it died or went silent mid-answer
                    raise unreachable(server, "stopped answering", error) from error
            finally:
                self._responses.pop(request_id, None)
                await response.aclose()  # closing mid-stream makes the server abort the request
        finally:
            server.in_flight.discard(request_id)

    async def _open_stream(
        self, prompt_ids: list[int], params: Any, request_id: str
    ) -> tuple[Server, httpx.Response]:
        """Send the request to the best server that takes the connection; it counts as in flight there.

        A refused connection means the request reached nobody, so the next
        server is tried. Any later failure is raised: the request may be
        running on that server, and sending it twice would double the work.
        """
        refused: ServerUnreachableError | None = None
        for server in servers_to_try(self.servers):
            body = completion_body(server.model, prompt_ids, params)
            headers = {"X-Request-Id": request_id}
            request = self._client.build_request(
                "POST", f"{server.url}/v1/completions", json=body, headers=headers
            )
            server.in_flight.add(request_id)
            try:
                response = await self._client.send(request, stream=True)
            except BaseException as error:
                server.in_flight.discard(request_id)
                if isinstance(error, httpx.ConnectError | httpx.ConnectTimeout):
                    refused = unreachable(server, "refused the connection", error)
                    continue
                if isinstance(error, httpx.TransportError):
                    raise unreachable(server, "is unreachable", error) from error
                raise
            server.healthy = True
            return server, response
        assert refused is not None, "ENGINE_URLS lists at least one server"
        raise refused

    async def abort(self, request_id: str) -> None:
        """Close the request's stream; the server aborts it when its client goes away."""
        response = self._responses.pop(request_id, None)
        if response is not None:
            await response.aclose()

    def get_num_unfinished_requests(self) -> int:
        return sum(len(s.in_flight) for s in self.servers)

    async def check_health(self) -> None:
        """GET /health on every server, in parallel; raise unless at least one answers."""

        async def probe(server: Server) -> None:
            try:
                response = await self._client.get(f"{server.url}/health", timeout=self._probe_timeout)
                server.healthy = response.status_code == 200
            except httpx.HTTPError:
                server.healthy = False

        await asyncio.gather(*(probe(s) for s in self.servers))
        if not any(s.healthy for s in self.servers):
            raise ServerUnreachableError("no vLLM server answered /health")

    async def aclose(self) -> None:
        """Close open streams and the connection pool."""
        for request_id in list(self._responses):
            await self.abort(request_id)
        with contextlib.suppress(Exception):
            await self._client.aclose()

    def shutdown(self) -> None:
        """Nothing runs in this process; the servers are the operators' (aclose frees the pool)."""


@contextlib.asynccontextmanager
async def remote_engine_lifespan(settings: Settings) -> AsyncIterator[ChatEngine]:
    """Chat through the vLLM servers of ENGINE_URLS; nothing to start here but a connection pool."""
    from vllm.tokenizers import get_tokenizer

    await prepare_default_model(settings)
    tokenizer = await asyncio.to_thread(get_tokenizer, settings.model_path)
    remote = RemoteLLM(
        settings.engine_url_list,
        tokenizer,
        connect_timeout=settings.engine_connect_timeout_seconds,
        idle_timeout=settings.engine_stream_timeout_seconds,
        max_connections=settings.engine_max_connections,
    )
    try:
        await remote.connect()
        engine = ChatEngine(remote, remote.max_model_len)
        await engine.warm_up()
        yield engine
    finally:
        await remote.aclose()
