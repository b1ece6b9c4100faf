"""Which model answers a conversation: the one chosen on the page (Chainlit's chat profile), else the
one its stored answers name, else the default; a name that is not served is refused, saying what is.
With ENGINE_URLS the models offered change while the service runs (`OfferedChats`): a conversation on
a model whose servers went away is refused, saying so, until a server lists the model again."""

from __future__ import annotations

import json
from collections.abc import Collection, Iterator, Mapping
from typing import Any, TypeVar

from services.chat.session import ChatSession
from services.engine import ServedModels, UnavailableModelError, UnknownModelError

MODEL_KEY = "model"  # in an answer's metadata: the model that wrote it (when several are served)
Chat = TypeVar("Chat")


class OfferedChats(Mapping[str, Any]):
    """The chat services of the models offered now, in their order; `known`: every model's, offered
    now or not. `chats` gains the services of models added later (the runtime adds them)."""

    def __init__(self, chats: dict[str, Any], models: ServedModels) -> None:
        self._chats = chats
        self._models = models

    def __getitem__(self, name: str) -> Any:
        if name in self._chats and name in self._models.names:
            return self._chats[name]
        raise KeyError(name)

    def __iter__(self) -> Iterator[str]:
        return iter([name for name in self._models.names if name in self._chats])

    def __len__(self) -> int:
        return len(list(iter(self)))

    @property
    def known(self) -> list[str]:
        return list(self._chats)


def known_of(chats: Mapping[str, Any]) -> Collection[str]:
    """Every model the service has served (an `OfferedChats`' known ones; else those of `chats`)."""
    return chats.known if isinstance(chats, OfferedChats) else chats.keys()


def chat_for(chats: Mapping[str, Chat], session: ChatSession, *missing: None) -> Chat | None:
    """The chat service of the session's model (empty: the first, the default). When the session names
    one that is not served: None if `missing` is given, else UnknownModelError."""
    name = session.model or next(iter(chats), "")
    if name not in chats:
        if missing:
            return None
        raise UnknownModelError(name, list(chats))
    return chats[name]


def refusal_of(chats: Mapping[str, Any], session: ChatSession) -> str:
    """What the user is told when the session's model is not served (or no longer available)."""
    error = UnavailableModelError if session.model in known_of(chats) else UnknownModelError
    return f"{error(session.model, list(chats))} Choose one in the model menu at the top."


def choose(chats: Mapping[str, Any], session: ChatSession, requested: object) -> str | None:
    """Set the session's model to `requested` (None or empty: the default); return the refusal to tell
    the user when that model is not served (the session then answers nothing until a served one is
    chosen)."""
    # One model offered: there is no choice, unless the one asked for was served and went away.
    one = len(chats) == 1 and not (isinstance(requested, str) and requested in known_of(chats))
    if requested is None or requested == "" or one:
        session.model = next(iter(chats), "")
        return None
    session.model = requested if isinstance(requested, str) else repr(requested)
    return refusal_of(chats, session) if chat_for(chats, session, None) is None else None


def model_of_thread(thread: Mapping[str, Any]) -> str | None:
    """The model a stored conversation was answered by: its newest answer's MODEL_KEY."""
    for step in reversed(list(thread.get("steps") or [])):
        metadata = step.get("metadata") if isinstance(step, Mapping) else None
        if isinstance(metadata, str):
            try:
                metadata = json.loads(metadata)
            except ValueError:
                continue
        if isinstance(metadata, dict) and isinstance(metadata.get(MODEL_KEY), str):
            return metadata[MODEL_KEY]
    return None
