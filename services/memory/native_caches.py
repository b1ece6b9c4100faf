"""Caches inside libraries that fill slowly for hours: fill or bound them once, at start.

Two caches in the app's process are bounded but fill so slowly under load that they
read as a leak of 1-2 MB/hour for the first hours (BENCHMARKS.md, "Bounded caches that
fill slowly"):

- numpy keeps up to 7 freed data buffers for every size under 1,024 bytes (its
  `alloc.c`, ~3.6 MB when full), filled one size at a time as arrays of new
  lengths come and go. Filling it at start makes its memory a constant.
- Hugging Face tokenizers' BPE model caches up to 10,000 words (~4 MB), filled as
  new words are read. A smaller bound fills within minutes and costs little speed;
  the engine's lifespan applies it (TOKENIZER_WORD_CACHE) before the warm-up, and each
  maintenance round to the copies vLLM's tokenizer pool adds (word_caches.py).
"""

from __future__ import annotations

import logging

import numpy as np

logger = logging.getLogger(__name__)

# numpy/_core/src/multiarray/alloc.c: NBUCKETS (sizes below 1,024 bytes) and NCACHE (7 per size).
NUMPY_CACHED_SIZES = 1024
NUMPY_BUFFERS_PER_SIZE = 7


def fill_numpy_buffer_cache() -> int:
    """Fill numpy's small-buffer cache to its bound; return the bytes it now holds.

    Every size is allocated NUMPY_BUFFERS_PER_SIZE times and released together,
    so each size's bucket is full and later arrays reuse these buffers.
    """
    for size in range(1, NUMPY_CACHED_SIZES):
        held = [np.empty(size, dtype=np.uint8) for _ in range(NUMPY_BUFFERS_PER_SIZE)]
        del held
    return NUMPY_BUFFERS_PER_SIZE * sum(range(1, NUMPY_CACHED_SIZES))


def settle_native_caches() -> None:
    """Fill numpy's buffer cache; one log line."""
    logger.info("native caches: numpy's small-buffer cache filled (%.1f MB)", fill_numpy_buffer_cache() / 1e6)
