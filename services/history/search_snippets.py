"""The words around a match, shown with a search result: what a person recognises a conversation by
when its name does not say why it was found.

Chainlit 2.12's search dialog shows a result's name and nothing else (two lines at most), so a result
found by a message carries that message's words around the first match after its name:
"Plans for the trip — …Remind me to photograph a quetzal there…". Only search results are named so;
the sidebar's list and the conversation keep the stored name. Words are matched as the index matches
them (thread_search.py): case and accents folded, the last word of the search also as a prefix.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping
from typing import Any

SNIPPET_CHARS = 90  # of a message shown with its result: with a short name, the dialog's two lines
SEPARATOR = " — "
ELLIPSIS = "…"
WORD = re.compile(r"[^\W_]+")  # a word, as thread_search.py reads the search
SPACES = re.compile(r"\s+")


def folded(word: str) -> str:
    """`word` as the index compares it: lower case, without accents."""
    decomposed = unicodedata.normalize("NFKD", word.lower())
    return "".join(c for c in decomposed if not unicodedata.combining(c))


def snippet(text: str, words: list[str], min_prefix_chars: int, max_chars: int = SNIPPET_CHARS) -> str:
    """About `max_chars` of `text` around its first word that is one of `words` (the last of them also
    as a prefix of at least `min_prefix_chars`), cut between words, white space made single spaces,
    `…` where words were left out; from the start when no word is found."""
    spans = _spans(text)
    hit = min(_matches(text, spans, words, min_prefix_chars).values(), default=0)
    start = max(0, min(hit - max_chars // 3, len(text) - max_chars))  # a third before, if it fits
    start = next((s for s, _ in spans if s >= start), hit) if start else 0  # at a word's start
    limit = start + max_chars
    end = max((e for _, e in spans if start < e <= limit), default=limit)  # at a word's end, if one fits
    if not any(s >= end for s, _ in spans):
        end = min(len(text), limit)  # nothing but punctuation after it, or one long word
    shown = SPACES.sub(" ", text[start:end]).strip()
    return (ELLIPSIS if start else "") + shown + (ELLIPSIS if end < len(text) else "")


def _matches(
    text: str, spans: list[tuple[int, int]], words: list[str], min_prefix_chars: int
) -> dict[str, int]:
    """Where each of `words` (folded) first matches in `text`; a word not found is left out."""
    wanted = {folded(word) for word in words}
    typed_last = words[-1] if words else ""
    last = folded(typed_last)
    prefix = last if len(typed_last) >= min_prefix_chars else None  # as thread_search.py's queries
    found: dict[str, int] = {}
    for start, end in spans:
        word = folded(text[start:end])
        if word in wanted:
            found.setdefault(word, start)
        if prefix is not None and word.startswith(prefix):
            found.setdefault(last, start)
    return found


def holds_every_word(text: str, words: list[str], min_prefix_chars: int) -> bool:
    """Whether `text` itself matches the whole search (each word, the last also as a prefix)."""
    return len(_matches(text, _spans(text), words, min_prefix_chars)) == len({folded(word) for word in words})


def named_with_snippet(
    name: str | None, found_in: str | None, words: list[str], min_prefix_chars: int
) -> str | None:
    """A search result's name with the words of the message it was found by; the name alone when it
    holds every word itself (Chainlit names a conversation after its first message)."""
    if not found_in or not found_in.strip():
        return name
    if name and holds_every_word(name, words, min_prefix_chars):
        return name
    said = snippet(found_in, words, min_prefix_chars)
    return f"{name}{SEPARATOR}{said}" if name else said


def _spans(text: str) -> list[tuple[int, int]]:
    return [match.span() for match in WORD.finditer(text)]


def with_snippets(
    rows: list[dict[str, Any]], messages: Mapping[str, str], words: list[str], min_prefix_chars: int
) -> list[dict[str, Any]]:
    """Search rows (`best`: the id of the message each was found by) named with those messages' words
    (`messages`: id -> text)."""
    return [
        {
            **row,
            "name": named_with_snippet(
                row.get("name"), messages.get(str(row.get("best"))), words, min_prefix_chars
            ),
        }
        for row in rows
    ]
