"""The models served, by name: a `ChatEngine` each, the first offered the default.

In process (MODELS) every model is offered for the service's whole life. With ENGINE_URLS the models
offered are those a healthy vLLM server lists now (remote_models.py): `offered` tells them, a model
seen later is `add`ed (listeners hear of it), and one whose servers went away is refused with
`UnavailableModelError` until a server lists it again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from services.engine.chat_engine import ChatEngine

MAX_SHOWN_NAME_CHARS = 80


def _shown(name: str) -> str:
    return name if len(name) <= MAX_SHOWN_NAME_CHARS else name[:MAX_SHOWN_NAME_CHARS] + "…"


class UnknownModelError(ValueError):
    """A client named a model this service does not serve."""

    def __init__(self, name: str, served: list[str]) -> None:
        super().__init__(f"The model «{_shown(name)}» is not served here; served: {', '.join(served)}.")
        self.name = name


class UnavailableModelError(UnknownModelError):
    """A client named a model this service served, whose vLLM servers no longer list it or answer."""

    def __init__(self, name: str, served: list[str]) -> None:
        ValueError.__init__(
            self,
            f"The model «{_shown(name)}» is not available right now: no vLLM server serving it answers; "
            f"available: {', '.join(served) or 'none'}.",
        )
        self.name = name


class ServedModels:
    """The engines by name, in the order of MODELS (or of the servers' listings); the first offered
    answers when no model is chosen."""

    def __init__(
        self, engines: dict[str, ChatEngine], offered: Callable[[], list[str]] | None = None
    ) -> None:
        assert engines, "at least one model is served"
        self._engines = dict(engines)
        self._offered = offered
        self._listeners: list[Callable[[str, ChatEngine], None]] = []

    @property
    def names(self) -> list[str]:
        """The names offered now (all of them in process). When the servers list none of them, the
        first stays offered: its requests fail as the engine's do ("not available right now")."""
        if self._offered is None:
            return list(self._engines)
        return [name for name in self._offered() if name in self._engines] or self.known[:1]

    @property
    def known(self) -> list[str]:
        """Every model served since the start, offered now or not."""
        return list(self._engines)

    @property
    def default_name(self) -> str:
        return self.names[0]

    @property
    def default(self) -> ChatEngine:
        return self._engines[self.default_name]

    def __len__(self) -> int:
        return len(self._engines)

    def __iter__(self) -> Iterator[tuple[str, ChatEngine]]:
        return iter(list(self._engines.items()))

    def resolve(self, name: object) -> str:
        """The served name for a client's choice: empty or None is the default; anything else must be
        offered now (UnknownModelError, UnavailableModelError for one whose servers went away)."""
        if name is None or name == "":
            return self.default_name
        offered = self.names
        if isinstance(name, str) and name in offered:
            return name
        if isinstance(name, str) and name in self._engines:
            raise UnavailableModelError(name, offered)
        raise UnknownModelError(str(name), offered)

    def get(self, name: object) -> ChatEngine:
        return self._engines[self.resolve(name)]

    def engine(self, name: str) -> ChatEngine:
        """The engine of a known model, offered now or not (KeyError for others)."""
        return self._engines[name]

    def add(self, name: str, engine: ChatEngine) -> None:
        """A model first listed after the start: served from now on; the listeners are told."""
        self._engines[name] = engine
        for listener in list(self._listeners):
            listener(name, engine)

    def on_added(self, listener: Callable[[str, ChatEngine], None]) -> None:
        self._listeners.append(listener)
