"""Which chunks of a document answer a question best (BM25)."""

from __future__ import annotations

import re

from rank_bm25 import BM25Okapi

_WORD = re.compile(r"\w+")


def _words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def rank_chunks(chunks: list[str], question: str, top_k: int) -> list[int]:
    """Indices of the `top_k` chunks most relevant to `question` (BM25), in document order."""
    if top_k <= 0 or not chunks:
        return []
    if top_k >= len(chunks):
        return list(range(len(chunks)))
    corpus = [_words(chunk) for chunk in chunks]
    query = _words(question)
    if not query or not any(corpus):
        return list(range(top_k))
    scores = BM25Okapi(corpus).get_scores(query)
    wanted = set(query)
    # BM25's idf is 0 for a word in half of a tiny corpus: raw overlap breaks such ties.
    overlap = [sum(word in wanted for word in words) for words in corpus]
    best = sorted(range(len(chunks)), key=lambda index: (-scores[index], -overlap[index], index))
    return sorted(best[:top_k])
