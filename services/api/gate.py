"""The one door of the API: every /v1 request passes `ApiGate.__call__` before vLLM's layer sees it.

In order: the API is up (503), the caller holds a key (401), the path is served (404), the body fits
(413) and passes the checks (400, checks.py), admission lets it in (429 with Retry-After,
`AdmissionPolicy` below), its worst case fitting what its owner has left of their per-minute tokens
and budgets, or with shorter answers that fit (demand.py); then vLLM's layer answers, and metrics
record the route, status and timings. Everything the service decides about an API request is
decided here.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any, Protocol

from starlette.datastructures import URLPath
from starlette.routing import BaseRoute, Match, NoMatchFound

from services.accounts.keys import ApiKeyStore, KeyHolder
from services.admission.grants import Demand
from services.admission.limits import user_key
from services.admission.refusals import Refused
from services.admission.service import Admission
from services.admission.waiting_line import API
from services.api.checks import MAX_JSON_DEPTH, check_request, parse_body
from services.api.demand import request_demand, with_answer_limit
from services.api.errors import ApiError, with_normalized_errors
from services.api.metrics import ApiMetrics, route_label
from services.api.server import SERVED_PATHS
from services.api.usage import AnswerMeter
from services.config import Settings

logger = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
MISSING_KEY = (
    "No API key: send it as `Authorization: Bearer <key>` (make one with /key new in the chat, or "
    "`python -m services.accounts key create <user>`)."
)
GENERATING_PATHS = ("/v1/chat/completions", "/v1/completions")
DEFAULT_RETRY_AFTER_SECONDS = 5.0  # a refusal without an estimate (too many requests at once)


class Server(Protocol):
    """What answers a request once the gate let it in: vLLM's layer (server.py) or the ENGINE_URLS
    servers' own /v1 (remote.py)."""

    ready: bool

    async def app(self, scope: Scope, receive: Callable, send: Callable) -> None: ...

    async def start(self, engine_client: Any) -> None: ...

    async def stop(self) -> None: ...


@dataclass(frozen=True)
class Admitted:
    """How an admitted request runs: its engine priority (None: the engine's default) and its answer
    limit per sequence when it was cut to fit its owner's limits (None: as it asked)."""

    priority: int | None = None
    answer_tokens: int | None = None


class AdmissionPolicy(Protocol):
    """What the gate asks before a generating request runs (the overload rules plug in here)."""

    def admit(
        self, holder: KeyHolder, answer: AnswerMeter, path: str = GENERATING_PATHS[0]
    ) -> contextlib.AbstractAsyncContextManager[Admitted]:
        """Hold the request's place while it runs and yield how it runs; on exit count `answer`'s
        tokens against the holder's per-user limits and budgets. Raise ApiError(429,
        retry_after_seconds=...) when it may not run now. `answer` holds the request to `path`."""
        ...


class AdmitAll:
    """No admission layer: every request runs at once, as asked, at the engine's default priority."""

    @contextlib.asynccontextmanager
    async def admit(
        self, holder: KeyHolder, answer: AnswerMeter, path: str = GENERATING_PATHS[0]
    ) -> AsyncIterator[Admitted]:
        yield Admitted()


class SharedAdmission:
    """Chat's overload rules for API requests, through `Admission.admit`: a request is one turn of its
    key's owner (USER_MAX_CONCURRENT_TURNS, USER_TOKENS_PER_MINUTE and budgets shared with their
    chat), its worst case (every sequence) held against what they have left, waits in the same line as
    chat turns ranked API_AGING_SECONDS later, and runs with that place as vLLM's priority. A refusal
    becomes 429 with Retry-After."""

    def __init__(
        self,
        admission: Admission,
        count_tokens: Callable[[str], int],
        context_tokens: Callable[[Any], int] | None = None,
    ) -> None:
        """`context_tokens`: the context window of the model a request names (default MAX_MODEL_LEN)."""
        self.admission = admission
        self.count_tokens = count_tokens
        default_context = admission.settings.max_model_len
        self.context_tokens = context_tokens or (lambda model: default_context)

    @contextlib.asynccontextmanager
    async def admit(
        self, holder: KeyHolder, answer: AnswerMeter, path: str = GENERATING_PATHS[0]
    ) -> AsyncIterator[Admitted]:
        request = answer.request if isinstance(answer.request, dict) else {}

        def demand() -> Demand:
            context = self.context_tokens(request.get("model"))
            return request_demand(path, request, self.count_tokens, context)

        try:
            async with self.admission.admit(API, user_key(holder.user), demand) as slot:
                try:
                    yield Admitted(slot.priority or None, slot.grant.cut)
                finally:
                    answer_tokens = answer.tokens(self.count_tokens)
                    slot.charge(answer_tokens)
                    slot.used(answer.prompt_tokens(self.count_tokens), answer_tokens)
        except Refused as refusal:
            retry = refusal.retry_after_seconds or DEFAULT_RETRY_AFTER_SECONDS
            raise ApiError(429, str(refusal), refusal.reason, retry_after_seconds=retry) from None


class ApiGate:
    """Keys, request limits, admission and metrics in front of vLLM's OpenAI layer (an ASGI app)."""

    def __init__(
        self,
        settings: Settings,
        server: Server,
        metrics: ApiMetrics,
        keys: ApiKeyStore | None = None,
        admission: AdmissionPolicy | None = None,
    ) -> None:
        """`keys` None: no accounts database, so no key is known; `admission` None: `AdmitAll`."""
        self.settings = settings
        self.server = server
        self.metrics = metrics
        self.keys = keys
        self.admission: AdmissionPolicy = admission if admission is not None else AdmitAll()

    async def __call__(self, scope: Scope, receive: Callable, send: Callable) -> None:
        path = scope["path"]
        started = time.monotonic()
        route = route_label(path)
        status: dict[str, Any] = {"code": 500, "first_chunk_at": None}

        async def send_and_record(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            elif message["type"] == "http.response.body" and status["first_chunk_at"] is None:
                status["first_chunk_at"] = time.monotonic()
            await send(message)

        self.metrics.in_flight.labels(route).inc()
        try:
            await self._serve(scope, receive, send_and_record)
        except ApiError as error:
            await error.send(send_and_record)
        finally:
            self.metrics.in_flight.labels(route).dec()
            self.metrics.requests.labels(route, str(status["code"])).inc()
            if status["first_chunk_at"] is not None:
                self.metrics.first_chunk.labels(route).observe(status["first_chunk_at"] - started)
            self.metrics.duration.labels(route).observe(time.monotonic() - started)

    async def _serve(self, scope: Scope, receive: Callable, send: Callable) -> None:
        if not self.server.ready:
            raise ApiError(
                503, "The API is starting; try again in a few seconds.", "unavailable", retry_after_seconds=10
            )
        holder = await self._holder(scope)
        path = scope["path"]
        if path not in SERVED_PATHS:
            raise ApiError(
                404, f"{path} is not served here; the API serves {', '.join(SERVED_PATHS)}.", "unknown_url"
            )
        method = "POST" if path in GENERATING_PATHS else "GET"
        if scope["method"] != method:
            raise ApiError(405, f"{path} takes {method} requests.", "method_not_allowed")
        send = with_normalized_errors(send)  # vLLM's own error answers, in OpenAI's terms
        if method == "GET":
            await self.server.app(scope, receive, send)
            return
        body = await read_body(scope, receive, self.settings.api_max_body_bytes)
        request = parse_body(body, MAX_JSON_DEPTH)
        check_request(path, request, self.settings)
        answer = AnswerMeter(send, request)
        async with self.admission.admit(holder, answer, path) as admitted:
            changed = request
            if admitted.answer_tokens is not None:  # cut to fit what its owner has left
                changed = with_answer_limit(path, changed, admitted.answer_tokens)
            if admitted.priority is not None:  # vLLM's field, which callers may not set (checks.py)
                changed = {**changed, "priority": admitted.priority}
            if changed is not request:
                body = json.dumps(changed).encode()
                scope = {**scope, "headers": with_content_length(scope["headers"], len(body))}
            await self.server.app(scope, replay(body, receive), answer)

    async def _holder(self, scope: Scope) -> KeyHolder:
        key = bearer_token(scope)
        if not key:
            raise ApiError(401, MISSING_KEY, "missing_api_key")
        if self.keys is None:
            raise ApiError(
                401,
                "API keys need the accounts database, which this service runs without.",
                "invalid_api_key",
            )
        try:
            holder = await self.keys.holder(key)
        except Exception as error:
            logger.warning("API key check failed: %s", type(error).__name__)
            raise ApiError(
                503,
                "API keys cannot be checked right now (database unavailable).",
                "unavailable",
                retry_after_seconds=5,
            ) from None
        if holder is None:
            raise ApiError(401, "Incorrect API key provided (unknown or revoked).", "invalid_api_key")
        return holder


def bearer_token(scope: Scope) -> str:
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            return token.strip() if scheme.lower() == "bearer" else ""
    return ""


async def read_body(scope: Scope, receive: Callable, limit_bytes: int) -> bytes:
    """The whole request body, refused (413) as soon as it passes `limit_bytes`."""
    too_large = ApiError(
        413,
        f"The request body is larger than {limit_bytes:,} bytes, this service's limit.",
        "request_too_large",
    )
    for name, value in scope.get("headers", ()):
        if name == b"content-length" and value.isdigit() and int(value) > limit_bytes:
            raise too_large
    chunks = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ApiError(400, "The client went away before sending its request.", "client_disconnected")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit_bytes:
            raise too_large
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def with_content_length(headers: list[tuple[bytes, bytes]], length: int) -> list[tuple[bytes, bytes]]:
    return [*(h for h in headers if h[0] != b"content-length"), (b"content-length", str(length).encode())]


def replay(body: bytes, receive: Callable) -> Callable:
    """A `receive` that gives `body` once, then the client's own messages (its disconnect)."""
    sent = False

    async def receive_again() -> MutableMapping[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return receive_again


class ApiRoute(BaseRoute):
    """Every /v1 path, routed to the gate; placed before Chainlit's catch-all page route."""

    def __init__(self, gate: ApiGate) -> None:
        self.gate = gate

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        path = scope.get("path", "")
        if scope["type"] == "http" and (path == "/v1" or path.startswith("/v1/")):
            return Match.FULL, {}
        return Match.NONE, {}

    async def handle(self, scope: Scope, receive: Callable, send: Callable) -> None:
        await self.gate(scope, receive, send)

    def url_path_for(self, name: str, /, **path_params: Any) -> URLPath:
        """No named routes here. (Starlette's default raises NotImplementedError, which turned every
        `request.url_for(...)` of Chainlit's, e.g. its OAuth error redirect, into a 500.)"""
        raise NoMatchFound(name, path_params)
