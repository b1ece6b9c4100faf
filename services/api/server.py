"""vLLM's own OpenAI serving layer, assembled over our engine: its routers, state and error handlers.

Nothing of the protocol is ours: `init_app_state` (vllm/entrypoints/launchers/api_server/app_state.py)
builds vLLM's serving objects over the engine client, from an argument namespace made by vLLM's own
parser (`make_arg_parser`), and vLLM's route functions for /v1/chat/completions and /v1/completions
serve them, with vLLM's exception handlers giving OpenAI's error shape; /v1/models is vLLM's listing
without the model's path on this machine (`public_listing`). The FastAPI app
here is not mounted the usual way: Chainlit's catch-all page route would shadow it and Starlette does
not run a mounted app's lifespan, so `ApiRoute` (routing.py) puts it in front of Chainlit's routes and
the runtime calls `start` in the app's startup, once the engine runs.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from services.api.vllm_logs import one_line_client_errors
from services.config import Settings

logger = logging.getLogger(__name__)

SERVED_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/models")


def model_name(settings: Settings) -> str:
    """The name clients put in `model`: API_MODEL_NAME, else the model folder's (or id's) last part."""
    return settings.api_model_name or Path(settings.model_path.rstrip("/")).name


def vllm_args(settings: Settings) -> argparse.Namespace:
    """The namespace `vllm serve` would have for this model, from vLLM's own parser."""
    from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser(prog="vllm-chat-api"))
    args = parser.parse_args(
        [
            "--model",
            settings.model_path,
            "--served-model-name",
            model_name(settings),
            "--max-model-len",
            str(settings.max_model_len),
            "--disable-fastapi-docs",
        ]
    )
    validate_parsed_serve_args(args)
    return args


def public_listing(listing: dict[str, Any]) -> dict[str, Any]:
    """A /v1/models answer without the server's paths: vLLM puts the model's folder in each card's
    `root` (the ENGINE_URLS servers too, when started with a path); here it is the card's own id."""
    cards = [{**card, "root": card.get("id")} for card in listing.get("data", [])]
    return {**listing, "data": cards}


async def list_models(raw_request: Request) -> JSONResponse:
    """vLLM's /v1/models route, answered with `public_listing`."""
    listed = await raw_request.app.state.openai_serving_models.show_available_models()
    return JSONResponse(public_listing(listed.model_dump()))


def build_api_app() -> FastAPI:
    """A FastAPI app with vLLM's route functions for SERVED_PATHS (/v1/models: `list_models`), vLLM's
    exception handlers, and vLLM's tracebacks of client errors as one log line (vllm_logs.py)."""
    from vllm.entrypoints.openai.chat_completion.api_router import router as chat_router
    from vllm.entrypoints.openai.completion.api_router import router as completion_router
    from vllm.entrypoints.serve.exception_handling.register import init_exception_handler

    app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)
    for router in (chat_router, completion_router):
        app.router.routes.extend(r for r in router.routes if getattr(r, "path", "") in SERVED_PATHS)
    app.add_api_route("/v1/models", list_models, methods=["GET"])
    init_exception_handler(app)
    one_line_client_errors()
    return app


class OpenAiServer:
    """The API app and its life: state built over the engine at start, dropped at stop."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.app = build_api_app()
        self.model = model_name(settings)
        self.ready = False

    async def start(self, engine_client: Any) -> None:
        """Build vLLM's serving state over `engine_client` (an AsyncLLM) into the app's state."""
        from vllm.entrypoints.launchers.api_server.app_state import init_app_state

        args = vllm_args(self.settings)
        self.app.state.args = args
        supported_tasks = await engine_client.get_supported_tasks()
        await init_app_state(engine_client, self.app.state, args, supported_tasks)
        self.ready = True
        logger.info("API: %s served as %r at /v1 (tasks: %s)", args.model, self.model, supported_tasks)

    async def stop(self) -> None:
        self.ready = False
        state = self.app.state
        for name in list(vars(state).get("_state", {})):
            delattr(state, name)
