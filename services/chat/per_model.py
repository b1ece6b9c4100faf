"""A chat service per served model, all behind one admission: the runtime's `chats`, which follows the
models the vLLM servers add while the service runs (ENGINE_URLS)."""

from __future__ import annotations

import contextlib

from services.admission.service import Admission
from services.admission.waiting_line import CHAT, DOCUMENT
from services.chat.model_choice import OfferedChats
from services.chat.service import ChatService
from services.config import Settings
from services.engine import ChatEngine, ServedModels


def chats_per_model(
    models: ServedModels, admission: Admission, settings: Settings, stack: contextlib.AsyncExitStack
) -> OfferedChats:
    """The chat services of the models offered now; one added later gets its own (closed by `stack`)."""
    chats: dict[str, ChatService] = {}

    def add(name: str, engine: ChatEngine) -> None:
        chat = ChatService(admission.engine(engine, CHAT), settings, admission.engine(engine, DOCUMENT))
        stack.callback(chat.summarizer.close)  # its prefill meter listens to the engine
        chats[name] = chat

    for name, engine in models:
        add(name, engine)
    models.on_added(add)
    return OfferedChats(chats, models)
