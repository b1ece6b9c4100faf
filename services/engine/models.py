"""The models this process serves, by name: one `ChatEngine` each (MODELS), the first the default.

Each model is a whole engine (its own AsyncLLM, EngineCore and worker, its chat template and context
length), started one after the other and warmed up on its own (its decode speeds kept under its own
key, warmup_record.py). A name from a client that is not served is refused with `UnknownModelError`,
which says what is (served.py).
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path

from services.config import Settings
from services.engine.chat_engine import ChatEngine
from services.engine.lifespan import engine_lifespan
from services.engine.remote_models import remote_models_lifespan
from services.engine.served import ServedModels, UnavailableModelError, UnknownModelError

logger = logging.getLogger(__name__)
__all__ = ["ServedModels", "UnavailableModelError", "UnknownModelError", "model_names", "model_settings"]


def model_names(settings: Settings) -> list[str]:
    """The names the models are served under: API_MODEL_NAME (one model) or each folder's (or id's) last
    part."""
    paths = settings.model_list or [settings.model_path]
    if len(paths) == 1 and settings.api_model_name:
        return [settings.api_model_name]
    return [Path(path.rstrip("/")).name for path in paths]


def model_settings(settings: Settings) -> list[tuple[str, Settings]]:
    """Each served model's name and the settings its engine is built from (MODEL set to its path)."""
    paths = settings.model_list
    if not paths:
        return [(model_names(settings)[0], settings)]
    longest = settings.max_model_len
    return [
        (
            name,
            settings.replace(
                model=path,
                models="",
                api_model_name=name,
                max_model_len=min(longest, _context_of(path) or longest),
            ),
        )
        for name, path in zip(model_names(settings), paths, strict=True)
    ]


def _context_of(path: str) -> int | None:
    """A model folder's own context length (config.json's max_position_embeddings): MAX_MODEL_LEN is
    each model's upper bound, and a model with a shorter context keeps its own."""
    try:
        config = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    value = config.get("max_position_embeddings") if isinstance(config, dict) else None
    return value if isinstance(value, int) and value > 0 else None


@contextlib.asynccontextmanager
async def served_models_lifespan(settings: Settings) -> AsyncIterator[ServedModels]:
    """Start every model's engine in turn (each warmed up), yield them, close them in reverse; with
    ENGINE_URLS, the models the servers list (remote_models.py)."""
    if settings.engine_url_list:
        async with remote_models_lifespan(settings) as served:
            yield served
        return
    async with contextlib.AsyncExitStack() as stack:
        engines: dict[str, ChatEngine] = {}
        for name, own in model_settings(settings):
            engines[name] = await stack.enter_async_context(engine_lifespan(own))
            if len(model_settings(settings)) > 1:
                logger.info("model %s served (context %d tokens)", name, engines[name].max_model_len)
        yield ServedModels(engines)
