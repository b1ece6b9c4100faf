"""The engine for the settings: in-process vLLM, or the vLLM servers of ENGINE_URLS, warmed up."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from services.config import Settings
from services.engine.answer_tokens import AnswerTokens
from services.engine.chat_engine import ChatEngine
from services.engine.local import local_engine_lifespan
from services.engine.loop_guard import LoopGuardConfig
from services.engine.remote import remote_engine_lifespan
from services.engine.warmup import warm_up

logger = logging.getLogger(__name__)


def bound_tokenizer_word_cache(tokenizer: Any, words: int) -> bool:
    """Bound the word cache of a fast tokenizer's model (BPE) to `words`; False if it has none.

    tokenizers' default, 10,000 words (~4 MB), fills for hours under real traffic and
    reads as a leak (BENCHMARKS.md, "Bounded caches that fill slowly").
    """
    model = getattr(getattr(tokenizer, "backend_tokenizer", None), "model", None)
    resize = getattr(model, "_resize_cache", None)
    if resize is None:
        return False
    resize(words)
    return True


@contextlib.asynccontextmanager
async def engine_lifespan(settings: Settings) -> AsyncIterator[ChatEngine]:
    """Create the engine, yield it, close it (on every exit path)."""
    lifespan = remote_engine_lifespan if settings.engine_url_list else local_engine_lifespan
    async with lifespan(settings) as engine:
        engine.loop_guard = LoopGuardConfig.from_settings(settings)
        engine.answer_tokens = AnswerTokens(settings.answer_token_cache_tokens, settings.session_ttl_seconds)
        if bound_tokenizer_word_cache(engine.tokenizer, settings.tokenizer_word_cache):
            logger.info("tokenizer word cache bounded at %d words", settings.tokenizer_word_cache)
        # Ready only after the first shapes ran once (warmup.py); what it measured stays with the engine.
        engine.warm_up_report = await warm_up(engine, settings)
        yield engine
