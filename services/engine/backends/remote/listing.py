"""What the vLLM servers of ENGINE_URLS serve: their OpenAI `/v1/models` listings, read and merged.

A server's listing is read as hostile input: only a JSON object whose `data` is a list counts, only
its first `limit` entries are looked at, an entry counts only with a string `id` of at most
MAX_ID_CHARS characters and a whole positive `max_model_len` (vLLM adds it to every card), and an id
listed twice keeps its first card. A model is offered under its id's last path part (vLLM's default
id is the path or Hugging Face id it loaded), as MODELS names in-process models; its context length
is the smallest any answering server listing it gives (a request may land on any of them).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

MAX_ID_CHARS = 200
MAX_CONTEXT_TOKENS = 16_777_216  # no model has more; a larger number is a broken listing


@dataclass(frozen=True)
class Card:
    """One model a server lists: the id it is asked for by, its context length, what it loaded."""

    id: str
    max_model_len: int
    root: str = ""

    @property
    def name(self) -> str:
        """The name it is offered under: the id's last path part."""
        return public_name(self.id)


def public_name(model_id: str) -> str:
    return PurePosixPath(model_id.rstrip("/")).name or model_id


def parse_listing(document: Any, limit: int) -> dict[str, Card]:
    """A server's models by the name they are offered under, from its `/v1/models` JSON (first of a
    name kept; at most `limit`). Anything else than vLLM's shape gives fewer cards, never an error."""
    entries = document.get("data") if isinstance(document, dict) else None
    if not isinstance(entries, list):
        return {}
    cards: dict[str, Card] = {}
    for entry in entries[:limit]:
        card = _card(entry)
        if card is not None and card.name not in cards:
            cards[card.name] = card
    return cards


def _card(entry: Any) -> Card | None:
    if not isinstance(entry, dict):
        return None
    model_id = entry.get("id")
    length = entry.get("max_model_len")
    root = entry.get("root")
    if not isinstance(model_id, str) or not model_id.strip() or len(model_id) > MAX_ID_CHARS:
        return None
    if type(length) is not int or not 0 < length <= MAX_CONTEXT_TOKENS:
        return None
    if not public_name(model_id).isprintable():
        return None
    root = root if isinstance(root, str) and len(root) <= 4096 and root.isprintable() else ""
    return Card(model_id, length, root)


@dataclass(frozen=True)
class Offer:
    """A model some healthy server serves: its name, context length, and a card to load it by."""

    name: str
    max_model_len: int
    card: Card


def merge(listings: Iterable[tuple[bool, Mapping[str, Card]]], wanted: list[str]) -> dict[str, Offer]:
    """The models offered, from each server's (answered, listing): every name a server that answered
    its last reading lists, in the order first seen, or, with `wanted` (MODELS' names), those of them,
    in that order."""
    offers: dict[str, Offer] = {}
    for answered, cards in listings:
        if not answered:
            continue
        for name, card in cards.items():
            known = offers.get(name)
            length = min(card.max_model_len, known.max_model_len) if known else card.max_model_len
            offers[name] = Offer(name, length, known.card if known else card)
    if not wanted:
        return offers
    return {name: offers[name] for name in wanted if name in offers}
