"""The tokenizer's word caches, bounded in every copy that encodes, vLLM's pooled copies included.

Hugging Face tokenizers' BPE model caches up to 10,000 words (~4 MB), filled for hours
as new words come (BENCHMARKS.md, "Bounded caches that fill slowly"). In vLLM's process
the tokenizer does not encode by itself: vLLM's renderer turns it into a pool
(`maybe_make_thread_pool`, vllm/tokenizers/hf.py) whose every call borrows a deep copy.

- A deep copy is rebuilt from the tokenizer's JSON, which does not carry the cache's
  bound: each copy starts again with tokenizers' default 10,000 words.
- The pool adds a copy whenever more threads encode at once than it holds, and never
  shrinks: it grows to the peak number of threads that ever encoded together.

So bounding the tokenizer object bounds no cache that fills. `WordCacheBound` bounds the
tokenizer, the pool's original and every pooled copy; applied again each maintenance
round, it bounds the copies added since (a new copy fills for one round at most).
"""

from __future__ import annotations

import logging
import queue
import weakref
from typing import Any

logger = logging.getLogger(__name__)

# Words the BPE model caches in each copy that encodes: tokenizers' own 10,000 (~4 MB a copy) fill slowly
# for hours; 1,000 hold 0.4 MB for 0.3 ms more per 1,000 prompt tokens (BENCHMARKS.md, bounded caches).
TOKENIZER_WORD_CACHE = 1000


def bound_tokenizer_word_cache(tokenizer: Any, words: int) -> bool:
    """Bound one fast tokenizer's BPE word cache to `words` (0 = no cache); False if it has none."""
    model = getattr(getattr(tokenizer, "backend_tokenizer", None), "model", None)
    resize = getattr(model, "_resize_cache", None)
    if resize is None:
        return False
    resize(words)
    return True


def _free_variables(function: Any) -> dict[str, Any]:
    """The variables a function closes over, by name ({} for anything else)."""
    code = getattr(function, "__code__", None)
    cells = getattr(function, "__closure__", None)
    if code is None or not cells:
        return {}
    return dict(zip(code.co_freevars, (cell.cell_contents for cell in cells), strict=True))


def _pool_of(tokenizer: Any) -> tuple[Any, queue.Queue] | None:
    """(the original, the queue of copies) of a vLLM tokenizer pool; None for a plain tokenizer.

    Read from the closure of the pool's `encode`: vLLM keeps both only there.
    """
    encode = getattr(type(tokenizer), "encode", None)
    borrow = _free_variables(encode).get("_borrow_from_pool")
    free = _free_variables(getattr(borrow, "__wrapped__", None))  # a contextmanager's function
    pool = free.get("tokenizer_pool")
    return (free.get("og_tokenizer"), pool) if isinstance(pool, queue.Queue) else None


class WordCacheBound:
    """Bounds the word cache of a tokenizer and of every copy vLLM's pool makes of it."""

    def __init__(self, tokenizer: Any, words: int) -> None:
        self.tokenizer = tokenizer
        self.words = words
        self._bounded: weakref.WeakSet[Any] = weakref.WeakSet()  # copies already bounded

    def copies(self) -> list[Any]:
        """The tokenizer, the pool's original and the copies in the pool now (not those lent out)."""
        found = [self.tokenizer]
        if (pool := _pool_of(self.tokenizer)) is not None:
            original, lent = pool
            with lent.mutex:
                found += [original, *lent.queue]
        return [copy for copy in found if copy is not None]

    def apply(self) -> int:
        """Bound the copies not bounded yet (a copy lent out waits for the next call); how many."""
        newly = 0
        for copy in self.copies():
            if copy not in self._bounded and bound_tokenizer_word_cache(copy, self.words):
                self._bounded.add(copy)
                newly += 1
        return newly

    @property
    def copies_alive(self) -> int:
        """Copies bounded so far that still exist: the tokenizer, the pool's original and its copies.
        Each copy costs ~8 MB with the default model, so a pool that grows shows here."""
        return len(self._bounded)

    async def round(self) -> int:
        """A maintenance round's step: bound the copies the pool added since the last one."""
        if newly := self.apply():
            logger.info("tokenizer pool grew: %d new copy(ies) bounded, %d alive", newly, self.copies_alive)
        return newly
