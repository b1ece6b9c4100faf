"""The token ids the engine wrote for recent answers, so the next turn's prompt repeats them exactly.

vLLM's prefix cache matches token ids, not text. A model may spell a word
with tokens the tokenizer would not pick for the same text (a frequency
penalty makes that common: the usual token is penalized, another spelling
wins). Re-encoding such an answer for the next prompt then differs from the
KV vLLM cached from the first such word on, and the follow-up re-reads the
rest of the answer. `AnswerTokens` keeps the generated ids of recent answers
(bounded in tokens and in time) and splices them back over the re-encoded
text when a prompt carries one of those answers unchanged.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Callable, Sequence

from cachetools import TTLCache

Message = dict[str, str]
# What an entry costs besides its ids (key, array header, the cache's links and dict slots:
# ~475 bytes under tracemalloc in tests/system/memory/test_leaks.py), in 4-byte ids: the bound then holds
# for short answers too, not only in ids.
ENTRY_OVERHEAD_IDS = 128
# Ids of recent answers kept (each for SESSION_TTL_SECONDS), counted with ENTRY_OVERHEAD_IDS more per
# answer: ~4 bytes a unit, so ~1 MB at most.
ANSWER_TOKEN_CACHE_TOKENS = 262_144


def _key(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


class AnswerTokens:
    """Generated ids of recent answers by their text, each for `ttl_seconds`.

    Bounded by `max_tokens` ids, each entry counted with ENTRY_OVERHEAD_IDS more:
    ~4 bytes per unit, so ANSWER_TOKEN_CACHE_TOKENS hold at most ~1 MB.
    """

    def __init__(self, max_tokens: int, ttl_seconds: float) -> None:
        self._ids: TTLCache[bytes, array] = TTLCache(
            maxsize=max(1, max_tokens), ttl=ttl_seconds, getsizeof=lambda ids: len(ids) + ENTRY_OVERHEAD_IDS
        )

    def __len__(self) -> int:
        return len(self._ids)

    def ids_for(self, text: str) -> list[int] | None:
        """The generated ids kept for `text`, if any."""
        ids = self._ids.get(_key(text))
        return None if ids is None else list(ids)

    def remember(self, text: str, token_ids: Sequence[int], decode: Callable[[list[int]], str]) -> bool:
        """Keep `token_ids` for `text` if they spell it (a stop token or stop string may trail them)."""
        ids = list(token_ids)
        for _ in range(8):  # drop what the text leaves out: an end-of-turn token, a stop string's tokens
            if not ids or len(ids) + ENTRY_OVERHEAD_IDS > self._ids.maxsize:
                return False
            spelled = decode(ids)
            if spelled == text:
                self._ids[_key(text)] = array("i", ids)  # 4 bytes a token
                return True
            if not spelled.startswith(text):
                return False
            ids.pop()
        return False

    def splice(
        self, messages: Sequence[Message], prompt_ids: list[int], encode: Callable[[str], list[int]]
    ) -> list[int]:
        """`prompt_ids` with each remembered assistant answer in the ids the engine generated for it."""
        out = prompt_ids
        search_from = 0
        for message in messages:
            if message["role"] != "assistant" or not message["content"]:
                continue
            generated = self.ids_for(message["content"])
            if generated is None:
                continue
            encoded = encode(message["content"])
            at = _find(out, encoded, search_from)
            if at < 0:  # the template changed the text: keep its encoding
                continue
            if out is prompt_ids:
                out = list(prompt_ids)
            out[at : at + len(encoded)] = generated
            search_from = at + len(generated)
        return out


def _find(haystack: list[int], needle: list[int], start: int) -> int:
    """Index of `needle` in `haystack` at or after `start`, or -1."""
    if not needle:
        return -1
    first = needle[0]
    size = len(needle)
    for index in range(start, len(haystack) - size + 1):
        if haystack[index] == first and haystack[index : index + size] == needle:
            return index
    return -1
