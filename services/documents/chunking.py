"""Token-bounded chunks of a document, split at paragraphs, lines, sentences, words, characters."""

from __future__ import annotations

import re
from collections.abc import Callable

_PARAGRAPH_BREAK = re.compile(r"\n[ \t\r\f\v]*\n\s*")
_SENTENCE_BREAK = re.compile(r"(?<=[.!?…。！？])\s+|(?<=[.!?][\"'”’)\]])\s+")
_JOINERS = ("\n\n", "\n", " ", "")
_Piece = tuple[str, int, str]  # text, tokens, joiner placed before it inside a chunk


def split_into_chunks(text: str, count_tokens: Callable[[str], int], max_tokens_per_chunk: int) -> list[str]:
    """Split `text` into chunks of at most `max_tokens_per_chunk` tokens each, in order.

    Paragraphs first, then lines, sentences, words (and characters for a giant word);
    whitespace between pieces is normalised, no other text is lost. Pieces are
    counted once and summed; each chunk is verified once and re-split if the sum lied.
    """
    if max_tokens_per_chunk < 1:
        raise ValueError("max_tokens_per_chunk must be at least 1")
    pieces: list[_Piece] = []
    for paragraph in _PARAGRAPH_BREAK.split(text):
        paragraph = paragraph.strip()
        if paragraph:
            pieces.extend(_pieces_of(paragraph, "\n\n", count_tokens, max_tokens_per_chunk))
    joiner_tokens = {joiner: count_tokens(joiner) for joiner in _JOINERS}
    chunks: list[str] = []
    for group in _pack(pieces, max_tokens_per_chunk, joiner_tokens):
        chunks.extend(
            _verified(group, count_tokens, max_tokens_per_chunk, max_tokens_per_chunk, joiner_tokens)
        )
    return chunks


def _split_lines(text: str) -> list[str]:
    return [line.strip() for line in text.split("\n") if line.strip()]


def _split_sentences(text: str) -> list[str]:
    return [sentence for sentence in _SENTENCE_BREAK.split(text) if sentence]


_SPLITTERS: tuple[tuple[Callable[[str], list[str]], str], ...] = (
    (_split_lines, "\n"),
    (_split_sentences, " "),
    (str.split, " "),
)


def _pieces_of(
    text: str, joiner: str, count_tokens: Callable[[str], int], limit: int, level: int = 0
) -> list[_Piece]:
    """`text` as pieces of at most `limit` tokens, splitting ever finer only where needed."""
    tokens = count_tokens(text)
    if tokens <= limit:
        return [(text, tokens, joiner)]
    for depth in range(level, len(_SPLITTERS)):
        splitter, inner_joiner = _SPLITTERS[depth]
        parts = splitter(text)
        if len(parts) > 1:
            pieces: list[_Piece] = []
            for index, part in enumerate(parts):
                part_joiner = joiner if index == 0 else inner_joiner
                pieces.extend(_pieces_of(part, part_joiner, count_tokens, limit, depth + 1))
            return pieces
    return _split_characters(text, joiner, count_tokens, limit)


def _split_characters(word: str, joiner: str, count_tokens: Callable[[str], int], limit: int) -> list[_Piece]:
    """A giant 'word' (base64, a URL) cut into the longest slices that fit, found by search."""
    pieces: list[_Piece] = []
    start = 0
    while start < len(word):
        remaining = len(word) - start
        good, bad = 0, min(max(limit, 1), remaining)
        while count_tokens(word[start : start + bad]) <= limit:  # grow until too long or done
            good = bad
            if bad == remaining:
                break
            bad = min(bad * 2, remaining)
        if good < bad and good != remaining:
            while bad - good > 1:  # largest fitting length lies in (good, bad)
                middle = (good + bad) // 2
                if count_tokens(word[start : start + middle]) <= limit:
                    good = middle
                else:
                    bad = middle
        if good == 0:
            raise ValueError(f"max_tokens_per_chunk={limit} cannot hold even one character")
        piece = word[start : start + good]
        pieces.append((piece, count_tokens(piece), joiner if start == 0 else ""))
        start += good
    return pieces


def _pack(pieces: list[_Piece], budget: int, joiner_tokens: dict[str, int]) -> list[list[_Piece]]:
    """Greedy packing by summed token counts, order preserved."""
    groups: list[list[_Piece]] = []
    current: list[_Piece] = []
    total = 0
    for piece in pieces:
        added = piece[1] + (joiner_tokens[piece[2]] if current else 0)
        if current and total + added > budget:
            groups.append(current)
            current = []
            total = 0
            added = piece[1]
        current.append(piece)
        total += added
    if current:
        groups.append(current)
    return groups


def _render(group: list[_Piece]) -> str:
    return group[0][0] + "".join(joiner + text for text, _tokens, joiner in group[1:])


def _verified(
    group: list[_Piece],
    count_tokens: Callable[[str], int],
    limit: int,
    budget: int,
    joiner_tokens: dict[str, int],
) -> list[str]:
    """The group's text if it really fits; else repack it with a smaller budget (tokenizers merge)."""
    text = _render(group)
    if len(group) == 1:
        return [text]
    actual = count_tokens(text)
    if actual <= limit:
        return [text]
    smaller = min(budget - 1, budget * limit // actual)
    chunks: list[str] = []
    for subgroup in _pack(group, max(smaller, 1), joiner_tokens):
        chunks.extend(_verified(subgroup, count_tokens, limit, max(smaller, 1), joiner_tokens))
    return chunks
