"""The models of the vLLM servers (ENGINE_URLS): what they list at `/v1/models`, a `ChatEngine` each.

At start every server's listing is read (listing.py: hostile input, at most ENGINE_MODELS_MAX each),
and every ENGINE_MODELS_REFRESH_SECONDS again. A model is offered while a server that answered the
last reading lists it; MODELS, when set, names the models offered and their order (others are not
offered). Requests for a model go only to the servers that list it (a router is sent the model's
name and routes by it).

Each model's prompts are rendered here with its own tokenizer and chat template, from the first of:
a MODELS entry that is a folder or id whose last part is the model's name; the folder the server
loaded (the listing's `root`) when it exists here; MODEL, when it names this model or the servers
serve one; the listing's `root` as a Hugging Face id. A model with none of them is not offered (and
logged), never answered under another model's template. Its context length is the listing's
`max_model_len` (the smallest among its servers).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path

from services.config import Settings
from services.config.engine import ENGINE_MODELS_MAX
from services.engine.backends.local import prepare_default_model
from services.engine.backends.remote.engine import RemoteLLM, remote_llm
from services.engine.backends.remote.listing import Offer, merge, public_name
from services.engine.backends.remote.model_view import RemoteModel
from services.engine.backends.remote.protocol import RemoteEngineError
from services.engine.chat_engine import ChatEngine
from services.engine.lifespan import build_chat_engine
from services.engine.served import ServedModels
from services.engine.warmup import warm_up

logger = logging.getLogger(__name__)


def tokenizer_source(settings: Settings, offer: Offer, only: bool) -> str:
    """Where the model's tokenizer (and chat template) is loaded from here; empty: nowhere."""
    for entry in settings.model_list:
        if "/" in entry and public_name(entry) == offer.name:
            return entry
    root = offer.card.root
    if root and Path(root).is_dir():
        return root
    if only or public_name(settings.model_path) == offer.name:
        return settings.model_path
    return root


class RemoteCatalogue:
    """The servers' models: offered now, their engines, and the refresh that finds new ones."""

    def __init__(self, settings: Settings, remote: RemoteLLM) -> None:
        self.settings = settings
        self.remote = remote
        self.wanted = [public_name(entry) for entry in settings.model_list]
        self.served: ServedModels | None = None
        self.unloadable: set[str] = set()  # names whose tokenizer could not be found (logged once)

    def offers(self) -> dict[str, Offer]:
        """The models listed at the last reading by servers that answered it (a router's last listing
        stands while it does not answer: its servers' health is the router's)."""
        return merge(((s.listed or self.remote.router, s.models) for s in self.remote.servers), self.wanted)

    def offered(self) -> list[str]:
        return list(self.offers())

    async def engine_for(self, offer: Offer, only: bool) -> ChatEngine | None:
        """The model's engine, with its own tokenizer; None (logged) when none can be loaded here."""
        from vllm.tokenizers import get_tokenizer

        source = tokenizer_source(self.settings, offer, only)
        try:
            if not source:
                raise FileNotFoundError("the listing names no folder or id (root)")
            if source == self.settings.model_path:
                await prepare_default_model(self.settings)
            tokenizer = await asyncio.to_thread(get_tokenizer, source)
        except Exception as error:
            self.unloadable.add(offer.name)
            logger.warning(
                "model %s of the vLLM servers is not offered: no tokenizer for it here (%s: %s); "
                "name its folder or id in MODELS",
                offer.name,
                type(error).__name__,
                error,
            )
            return None
        backend = RemoteModel(self.remote, offer.name, tokenizer)
        logger.info(
            "model %s offered (context %d tokens, template of %s)", offer.name, offer.max_model_len, source
        )
        return build_chat_engine(self.settings, backend, offer.max_model_len, self.remote.load)

    async def start(self) -> ServedModels:
        """An engine for every model offered at start; the default one warmed up."""
        offers = self.offers()
        engines: dict[str, ChatEngine] = {}
        for offer in offers.values():
            if (engine := await self.engine_for(offer, len(offers) == 1)) is not None:
                engines[offer.name] = engine
        if not engines:
            wanted = f" of MODELS ({', '.join(self.wanted)})" if self.wanted else ""
            raise RemoteEngineError(
                f"the vLLM servers of ENGINE_URLS list no model{wanted} that can be served"
            )
        self.served = ServedModels(engines, self.offered)
        default = self.served.default
        await warm_up(default, self.settings, default.warm_up_report)
        return self.served

    async def refresh(self) -> None:
        """Read the listings again; serve models listed for the first time, follow context lengths."""
        assert self.served is not None
        await self.remote.refresh_listings(ENGINE_MODELS_MAX)
        for name, offer in self.offers().items():
            if name in self.served.known:
                self.served.engine(name).max_model_len = offer.max_model_len
            elif name not in self.unloadable and (engine := await self.engine_for(offer, False)):
                self.served.add(name, engine)

    async def refresh_forever(self) -> None:
        while True:
            await asyncio.sleep(self.settings.engine_models_refresh_seconds)
            try:
                await self.refresh()
            except Exception:  # the next round tries again; the service keeps what it has
                logger.exception("reading the vLLM servers' models failed")


@contextlib.asynccontextmanager
async def remote_models_lifespan(settings: Settings) -> AsyncIterator[ServedModels]:
    """The servers' models served (warmed up), refreshed while yielded; the pool closed after."""
    remote = remote_llm(settings, None)
    try:
        await remote.connect(ENGINE_MODELS_MAX)
        remote.start_load_polling()
        catalogue = RemoteCatalogue(settings, remote)
        served = await catalogue.start()
        refresher = asyncio.create_task(catalogue.refresh_forever())
        try:
            yield served
        finally:
            refresher.cancel()
            await asyncio.gather(refresher, return_exceptions=True)
    finally:
        await remote.aclose()
