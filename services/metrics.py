"""HTTP routes that let operators and tests observe the service."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from starlette.routing import BaseRoute


def install_routes(app: FastAPI, status: Callable[[], dict[str, Any]]) -> None:
    """Add GET /status in front of Chainlit's catch-all page route."""

    async def status_route() -> JSONResponse:
        return JSONResponse(status())

    before = len(app.router.routes)
    app.add_api_route("/status", status_route, methods=["GET"], include_in_schema=False)
    _move_to_front(app, app.router.routes[before:])


def _move_to_front(app: FastAPI, routes: list[BaseRoute]) -> None:
    # Chainlit serves its page for every unknown path; routes added after
    # import would never be reached (see FIELD_NOTES), so they go first.
    for route in routes:
        app.router.routes.remove(route)
    app.router.routes[0:0] = routes
