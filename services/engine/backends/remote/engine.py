"""vLLM servers as the engine: the part of AsyncLLM that ChatEngine uses, over HTTP.

When one machine is not enough, operators run vLLM's own OpenAI-compatible servers (`vllm serve`,
with tensor/pipeline parallelism and multi-node) and set ENGINE_URLS. `RemoteLLM` then stands where
the in-process `AsyncLLM` stood: `ChatEngine` keeps the chat template, token budgets, streaming and
aborts, and sends token ids to `/v1/completions`, with its priority where the server accepts one, to
the servers that list the request's model. A conversation stays on the server that holds its prefix
while that server is healthy and not overloaded, else requests go by load (routing.py); when a server
refuses the connection, the next one gets the request. A server whose queue is full answers 503: the
user is told the service is busy. Closing a stream closes its HTTP response, and vLLM aborts a
request whose client went away, so no KV cache outlives its reader on the server either.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import httpx

import services.engine.backends.remote.routing as routing
from services.config import Settings
from services.engine.backends import LLMBackend
from services.engine.backends.local import prepare_default_model
from services.engine.backends.remote.model_listings import read_listing, refresh_listings
from services.engine.backends.remote.protocol import (
    Output,
    RemoteEngineError,
    ServerUnreachableError,
    chunk_output,
    completion_body,
    parse_event,
)
from services.engine.backends.remote.routing import Server, model_id, prefix_hashes, servers_to_try
from services.engine.backends.remote.server_load import poll_load_forever
from services.engine.errors import EngineBusyError
from services.engine.load import EngineLoad
from services.engine.route_hint import route_headers

logger = logging.getLogger(__name__)


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
        affinity_slack: int | None = None,
        router: bool = False,
    ) -> None:
        self.servers = [Server(url.rstrip("/")) for url in urls]
        self.router = router  # the one URL is a router: it routes, we read its servers' load
        self._tokenizer = tokenizer
        self._affinity_slack = affinity_slack  # None: by load only
        self.load = EngineLoad()
        self._poller: asyncio.Task | None = None
        # One stream is one connection: more requests than the pool holds wait for
        # a free one. A stream may sit silent for `idle_timeout` while a long
        # prompt is prefilled behind others.
        timeout = httpx.Timeout(idle_timeout, connect=connect_timeout)
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        self._client = httpx.AsyncClient(timeout=timeout, limits=limits)
        self._probe_timeout = connect_timeout
        self._responses: dict[str, httpx.Response] = {}  # open streams; each removes itself
        # Model servers that answered the last check_health, of those known (behind a router: the
        # servers it lists), and when (monotonic); None before the first check.
        self.servers_answering: tuple[int, int] | None = None
        self.servers_checked_at: float | None = None

    async def connect(self, limit: int = 1) -> None:
        """Learn each server's models (at most `limit` of each listing) and context windows; fail
        unless all of them answer. With one model wanted (limit 1), all must serve the same one."""
        for server in self.servers:
            server.models = await read_listing(self._client, server, limit, self._probe_timeout)
            if not server.models:
                raise ServerUnreachableError(f"vLLM server {server.url} did not list a model")
            first = next(iter(server.models.values()))
            server.model = first.id
            server.max_model_len = first.max_model_len
            server.accepts_priority = await self._accepts_priority(server)
        lengths = {s.max_model_len for s in self.servers}
        models = {s.model for s in self.servers}
        if limit == 1 and len(models) > 1:
            raise RemoteEngineError(f"ENGINE_URLS serve different models: {sorted(models)}")
        logger.info("vLLM servers %s serve %s (context %s)", [s.url for s in self.servers], models, lengths)

    async def refresh_listings(self, limit: int) -> None:
        """Read every server's listing again (model_listings.py)."""
        await refresh_listings(self._client, self.servers, limit, self._probe_timeout)

    async def _accepts_priority(self, server: Server) -> bool:
        """Whether the server takes a request priority (servers without priority scheduling may not)."""
        body = {"model": server.model, "prompt": [1], "max_tokens": 1, "priority": 1}
        try:
            response = await self._client.post(f"{server.url}/v1/completions", json=body)
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    def start_load_polling(self) -> None:
        """Read the servers' load once a second into `self.load` (stopped by aclose)."""
        ours = self.get_num_unfinished_requests
        self._poller = asyncio.create_task(
            poll_load_forever(self._client, self.servers, self.load, router=self.router, ours=ours)
        )

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

    async def generate(
        self, prompt: dict[str, Any], params: Any, request_id: str, *, priority: int = 0, model: str = ""
    ) -> AsyncIterator[Output]:
        """Stream one request's deltas from the best server that takes it (see routing.py); `model`:
        the name of a listed model, sent only to the servers that list it (empty: each its first)."""
        prompt_ids = list(prompt["prompt_token_ids"])
        server, response = await self._open_stream(prompt_ids, params, request_id, priority, model)
        try:
            self._responses[request_id] = response
            try:
                if response.status_code != 200:
                    await response.aread()
                    detail = response.text[:300]
                    if response.status_code == 503:  # its queue is full (vLLM's admission control)
                        raise EngineBusyError(f"vLLM server {server.url} is busy: {detail}")
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
        self, prompt_ids: list[int], params: Any, request_id: str, priority: int = 0, model: str = ""
    ) -> tuple[Server, httpx.Response]:
        """Chat's completion request, sent by `open_stream` (prefix affinity when it is on)."""
        hashes = prefix_hashes(prompt_ids) if self._affinity_slack is not None else []

        def body_for(server: Server) -> dict[str, Any]:
            return completion_body(
                model_id(server, model), prompt_ids, params, priority if server.accepts_priority else None
            )

        return await self.open_stream("/v1/completions", body_for, request_id, hashes, model)

    async def open_stream(
        self,
        path: str,
        body_for: Callable[[Server], dict[str, Any]],
        request_id: str,
        hashes: Sequence[int] = (),
        model: str = "",
    ) -> tuple[Server, httpx.Response]:
        """POST `body_for(server)` to `path` on the best server that takes the connection (of those
        listing `model`, when named); the request counts as in flight there (the caller discards it
        when done).

        A refused connection means the request reached nobody, so the next
        server is tried. Any later failure is raised: the request may be
        running on that server, and sending it twice would double the work.
        """
        refused: ServerUnreachableError | None = None
        for server in servers_to_try(self.serving(model), hashes, self._affinity_slack):
            headers = {"X-Request-Id": request_id, **route_headers()}
            request = self._client.build_request(
                "POST", f"{server.url}{path}", json=body_for(server), headers=headers
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
            server.prefixes.add(hashes)  # its prefix cache holds them now
            return server, response
        assert refused is not None, "ENGINE_URLS lists at least one server"
        raise refused

    def serving(self, model: str) -> list[Server]:
        """The servers that list `model` (empty: all of them); ServerUnreachableError when none does."""
        servers = [s for s in self.servers if not model or model in s.models]
        if not servers:
            raise ServerUnreachableError(f"no vLLM server lists the model {model}")
        return servers

    async def abort(self, request_id: str) -> None:
        """Close the request's stream; the server aborts it when its client goes away."""
        response = self._responses.pop(request_id, None)
        if response is not None:
            await response.aclose()

    def get_num_unfinished_requests(self) -> int:
        return sum(len(s.in_flight) for s in self.servers)

    async def check_health(self) -> None:
        """GET /health on every server, in parallel (behind a router: its list of servers); note how
        many answer in `servers_answering`; raise unless at least one does."""

        async def probe(server: Server) -> None:
            try:
                response = await self._client.get(f"{server.url}/health", timeout=self._probe_timeout)
                server.healthy = response.status_code == 200
            except httpx.HTTPError:
                server.healthy = False

        if self.router:  # its /health fails while any one server is down: ask it which are up
            answering = await self._router_servers(self.servers[0])
        else:
            await asyncio.gather(*(probe(s) for s in self.servers))
            answering = (sum(s.healthy for s in self.servers), len(self.servers))
        self.servers_answering, self.servers_checked_at = answering, time.monotonic()
        if not any(s.healthy for s in self.servers):
            raise ServerUnreachableError("no vLLM server answered /health")

    async def _router_servers(self, router: Server) -> tuple[int, int]:
        """(healthy, listed) servers behind a router, from vLLM's router's /workers; a router without
        that page counts as one server, healthy while it lists a model. A router that does not answer
        has none healthy (of as many as it listed last)."""
        known = self.servers_answering[1] if self.servers_answering else 1
        try:
            response = await self._client.get(f"{router.url}/workers", timeout=self._probe_timeout)
            if response.status_code == 200:
                workers = response.json().get("workers")
                workers = [w for w in workers if isinstance(w, dict)] if isinstance(workers, list) else []
                healthy = sum(w.get("is_healthy") is True for w in workers)
                router.healthy = healthy > 0
                return healthy, len(workers)
            models = await self._client.get(f"{router.url}/v1/models", timeout=self._probe_timeout)
            router.healthy = models.status_code == 200
            return int(router.healthy), 1
        except (httpx.HTTPError, ValueError, AttributeError):
            router.healthy = False
            return 0, known

    async def aclose(self) -> None:
        """Stop polling, close open streams and the connection pool."""
        if self._poller is not None:
            self._poller.cancel()
            await asyncio.gather(self._poller, return_exceptions=True)
        for request_id in list(self._responses):
            await self.abort(request_id)
        with contextlib.suppress(Exception):
            await self._client.aclose()

    def shutdown(self) -> None:
        """Nothing runs in this process; the servers are the operators' (aclose frees the pool)."""


def remote_llm(settings: Settings, tokenizer: Any) -> RemoteLLM:
    """A RemoteLLM over ENGINE_URLS with the settings' timeouts, pool and routing (not yet connected)."""
    return RemoteLLM(
        settings.engine_url_list,
        tokenizer,
        connect_timeout=settings.engine_connect_timeout_seconds,
        idle_timeout=settings.engine_stream_timeout_seconds,
        max_connections=settings.engine_max_connections,
        affinity_slack=routing.ENGINE_AFFINITY_SLACK if settings.engine_affinity_on else None,
        router=settings.engine_router,
    )


@contextlib.asynccontextmanager
async def remote_engine_lifespan(settings: Settings) -> AsyncIterator[tuple[LLMBackend, int, EngineLoad]]:
    """Chat through the vLLM servers of ENGINE_URLS (yielded with their context length and load);
    nothing to start here but a connection pool."""
    from vllm.tokenizers import get_tokenizer

    await prepare_default_model(settings)
    tokenizer = await asyncio.to_thread(get_tokenizer, settings.model_path)
    remote = remote_llm(settings, tokenizer)
    try:
        await remote.connect()
        remote.start_load_polling()
        yield remote, remote.max_model_len, remote.load
    finally:
        await remote.aclose()
