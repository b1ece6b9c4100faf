"""The engine for the settings: in-process vLLM, or the vLLM servers of ENGINE_URLS, warmed up."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator

from services.config import Settings
from services.engine.answer_tokens import ANSWER_TOKEN_CACHE_TOKENS, AnswerTokens
from services.engine.backends import LLMBackend
from services.engine.backends.local import local_engine_lifespan
from services.engine.backends.remote import remote_engine_lifespan
from services.engine.chat_engine import ChatEngine
from services.engine.load import EngineLoad
from services.engine.loop_guard import LoopGuardConfig
from services.engine.warmup import WarmUpReport, warm_up
from services.engine.warmup_record import WarmUpRecords, record_key
from services.memory import TOKENIZER_WORD_CACHE, WordCacheBound

logger = logging.getLogger(__name__)


def build_chat_engine(
    settings: Settings, backend: LLMBackend, max_model_len: int, load: EngineLoad
) -> ChatEngine:
    """A ChatEngine over `backend` with its parts from the settings (not warmed up)."""
    word_caches = WordCacheBound(backend.get_tokenizer(), TOKENIZER_WORD_CACHE)
    if bounded := word_caches.apply():
        logger.info("tokenizer word caches bounded at %d words (%d copies)", TOKENIZER_WORD_CACHE, bounded)
    return ChatEngine(
        backend,
        max_model_len,
        load=load,
        loop_guard=LoopGuardConfig.from_settings(settings),
        answer_tokens=AnswerTokens(ANSWER_TOKEN_CACHE_TOKENS, settings.session_ttl_seconds),
        word_caches=word_caches,
        warm_up_report=WarmUpReport(),
    )


@contextlib.asynccontextmanager
async def engine_lifespan(settings: Settings) -> AsyncIterator[ChatEngine]:
    """Create the engine with its parts from the settings, warm it up, yield it, close it (on every
    exit path)."""
    lifespan = remote_engine_lifespan if settings.engine_url_list else local_engine_lifespan
    async with lifespan(settings) as (backend, max_model_len, load):
        engine = build_chat_engine(settings, backend, max_model_len, load)
        # Ready only after the first shapes ran once (warmup.py); what it measured stays with the engine.
        # The in-process engine's decode speeds are kept for the next start (warmup_record.py); vLLM
        # servers elsewhere are measured every time (and their app need not import vLLM for a key).
        records = WarmUpRecords(settings.cache_dir, settings.warm_up_reuse_hours)
        key = None if settings.engine_url_list else record_key(settings, max_model_len)
        known = records.find(key) if key else None
        await warm_up(engine, settings, engine.warm_up_report, known)
        if key and known is None:
            records.save(key, engine.warm_up_report.decode_seconds_per_token)
        yield engine
