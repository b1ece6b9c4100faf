"""Operators' HTTP routes: GET /status, /metrics, /healthz, /readyz, /livez, /stats. The probes
(/healthz: the engine; /readyz: can this replica serve pages; /livez: would a restart help) are open
and tell only their status to anyone without OPS_TOKEN; the rest need it. FastAPI's API
documentation is off."""

from __future__ import annotations

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest
from starlette.routing import BaseRoute

from services.api.gate import ApiRoute
from services.observability.ops_access import operator_refusal
from services.runtime import Runtime
from services.web.chainlit_state import ChainlitStateCollector, chainlit_session_counts


def install_routes(app: FastAPI, runtime: Runtime) -> None:
    """Add the operators' routes in front of Chainlit's catch-all page route.

    All but the probes answer 401 without `Authorization: Bearer <OPS_TOKEN>` (without OPS_TOKEN,
    403 to requests that are not local: services/observability/ops_access.py); the probes give their
    detail to the same callers (services/observability/readiness.py says what each one asks).
    /metrics serves vLLM's own metrics (the default registry), then the app's `chat_*`.
    """
    chainlit_registry = CollectorRegistry()
    chainlit_registry.register(ChainlitStateCollector())

    def refusal(request: Request) -> tuple[int, str] | None:
        address = request.client.host if request.client is not None else None
        authorization = request.headers.get("authorization", "")
        return operator_refusal(runtime.settings.ops_token, authorization, address, request.headers)

    def operators_only(request: Request) -> None:
        if refused := refusal(request):
            status, detail = refused
            raise HTTPException(status, detail, {"WWW-Authenticate": "Bearer"} if status == 401 else None)

    async def status_route() -> JSONResponse:
        status = runtime.status.status()
        return JSONResponse({**status, **chainlit_session_counts()} if status["ready"] else status)

    async def metrics_route() -> Response:
        text = (
            generate_latest(REGISTRY) + generate_latest(runtime.registry) + generate_latest(chainlit_registry)
        )
        return Response(text, media_type=CONTENT_TYPE_LATEST)

    def probe_answer(request: Request, passed: bool, detail: dict) -> JSONResponse:
        shown = {"status": detail["status"]} if refusal(request) else detail
        return JSONResponse(shown, status_code=200 if passed else 503)

    async def healthz_route(request: Request) -> JSONResponse:
        # 200 "ok", "overloaded" or "degraded", 503 "down": the engine (ServiceStatus.health).
        return probe_answer(request, *await runtime.status.health())

    async def readyz_route(request: Request) -> JSONResponse:
        # 200 "ready", 503 "not ready": what balancers route on; never asks the engine.
        return probe_answer(request, *runtime.status.readiness())

    async def livez_route(request: Request) -> JSONResponse:
        # 200 "alive", 503 "dead": what restarts the replica; never asks remote servers.
        return probe_answer(request, *runtime.status.liveness())

    async def stats_route() -> JSONResponse:
        summary = runtime.report.summary()
        return JSONResponse({**summary, **chainlit_session_counts()} if summary["ready"] else summary)

    before = len(app.router.routes)
    guarded = [Depends(operators_only)]
    for path, endpoint, dependencies in (
        ("/status", status_route, guarded),
        ("/metrics", metrics_route, guarded),
        ("/healthz", healthz_route, []),
        ("/readyz", readyz_route, []),
        ("/livez", livez_route, []),
        ("/stats", stats_route, guarded),
    ):
        app.add_api_route(path, endpoint, methods=["GET"], include_in_schema=False, dependencies=dependencies)
    move_to_front(app, app.router.routes[before:])


def remove_api_docs(app: FastAPI) -> None:
    """Turn off FastAPI's schema and documentation pages (/openapi.json, /docs and its OAuth redirect,
    /redoc), which Chainlit's app serves to anyone without sign-in (Swagger UI loading its script
    from a CDN): as `FastAPI(openapi_url=None, docs_url=None, redoc_url=None)` would, so their paths
    get Chainlit's page like any other unknown path."""
    paths = {app.openapi_url, app.docs_url, app.redoc_url, app.swagger_ui_oauth2_redirect_url} - {None}
    app.router.routes[:] = [route for route in app.router.routes if getattr(route, "path", None) not in paths]
    app.openapi_url = app.docs_url = app.redoc_url = None


def install_api(app: FastAPI, runtime: Runtime) -> None:
    """Route every /v1 path to the API's gate, ahead of Chainlit's catch-all page route."""
    if runtime.api is not None:
        app.router.routes.insert(0, ApiRoute(runtime.api))


def move_to_front(app: FastAPI, routes: list[BaseRoute]) -> None:
    """Put `routes` before Chainlit's own: it serves its page for every unknown path, so routes
    added after it would never be reached."""
    for route in routes:
        app.router.routes.remove(route)
    app.router.routes[0:0] = routes
