"""Library caches that fill slowly stop growing once settled (services/memory, services/engine/lifespan.py).

Each case runs in a fresh interpreter, so the caches start empty, and measures
glibc's in-use heap around a workload that keeps bringing new sizes or new words.
The control arm, without the settling step, must grow: otherwise the test
could not fail.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from harness.server import ROOT

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="measures glibc's heap")

NUMPY_WORKLOAD = """
import json, random, sys
import numpy as np
from services.observability.maintenance import malloc_info
from services.memory import fill_numpy_buffer_cache

def workload(seed, longest):  # boolean masks and selections of lengths up to `longest`
    random.seed(seed)
    for _ in range(20000):
        mask = np.random.rand(random.randint(1, longest)) > 0.5
        mask[mask]

workload(0, 3)  # numpy's own first-use costs, before measuring
if sys.argv[1] == "settled":
    fill_numpy_buffer_cache()
before = malloc_info()["in_use_bytes"]
workload(1, 1023)  # every length below the cache's bound
print(json.dumps(malloc_info()["in_use_bytes"] - before))
"""

TOKENIZER_WORKLOAD = """
import contextlib, json, random, string, sys
from transformers import AutoTokenizer
from vllm.tokenizers.hf import maybe_make_thread_pool
from services.observability.maintenance import malloc_info
from services.memory.word_caches import WordCacheBound, _free_variables, bound_tokenizer_word_cache

tokenizer = AutoTokenizer.from_pretrained(sys.argv[2])
maybe_make_thread_pool(tokenizer, 2)  # what vLLM's renderer does to the engine's tokenizer
bound = WordCacheBound(tokenizer, 200)
if sys.argv[1] == "every copy":
    bound.apply()
else:  # the tokenizer object alone, as this app did before vLLM's pool was found
    assert bound_tokenizer_word_cache(tokenizer, 200)
with contextlib.ExitStack() as lent:  # 8 callers at once: the pool adds 6 copies
    for _ in range(8):
        lent.enter_context(_free_variables(type(tokenizer).encode)["_borrow_from_pool"]())
newly = bound.apply() if sys.argv[1] == "every copy" else 0  # as the next maintenance round does
random.seed(0)
made_up = lambda: "".join(random.choices(string.ascii_lowercase, k=random.randint(3, 10)))
for _ in range(400):  # the pool lends its copies in turn: each fills its cache to a bound of 200
    tokenizer.encode(" ".join(made_up() for _ in range(25)), add_special_tokens=False)
before = malloc_info()["in_use_bytes"]
for _ in range(160):  # 4,000 words never seen before
    tokenizer.encode(" ".join(made_up() for _ in range(25)), add_special_tokens=False)
growth = malloc_info()["in_use_bytes"] - before
alive = bound.copies_alive
print(json.dumps({"growth": growth, "copies": len(bound.copies()), "newly": newly, "alive": alive}))
"""


def _growth(script: str, *args: str) -> Any:
    done = subprocess.run([sys.executable, "-c", script, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, check=True)  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_filled_numpy_buffer_cache_does_not_grow_with_new_array_lengths():
    unsettled, settled = _growth(NUMPY_WORKLOAD, "unsettled"), _growth(NUMPY_WORKLOAD, "settled")
    assert unsettled > 200_000, f"the control arm should fill numpy's cache, grew {unsettled} B"
    assert settled < 32_000, f"numpy's filled cache still grew {settled} B"


@pytest.mark.long  # fills every tokenizer copy's cache: per commit, the other tests here
def test_every_copy_of_the_pooled_tokenizer_is_bounded(default_model_dir: Path):
    """vLLM encodes through a pool of deep copies that forget the bound; WordCacheBound reaches them.

    The control arm bounds only the tokenizer object: its copies fill tokenizers' default
    10,000-word caches. If an upgraded vLLM makes that arm stop growing, the pool keeps the
    bound by itself and word_caches.py's walk of it can go.
    """
    model = str(default_model_dir)
    control = _growth(TOKENIZER_WORKLOAD, "object only", model)
    bounded = _growth(TOKENIZER_WORKLOAD, "every copy", model)
    assert control["copies"] == bounded["copies"] == 10, (control, bounded)  # itself, the original, 8 copies
    assert bounded["newly"] == 6, bounded  # the copies the pool added were bounded by the second pass
    assert bounded["alive"] == 10, bounded  # what /status shows as app_tokenizer_copies
    assert control["growth"] > 300_000, f"the pool's copies should fill their caches, grew {control} B"
    assert bounded["growth"] < 32_000, f"the pool's copies still grew {bounded} B"


def test_a_tokenizer_without_a_word_cache_is_left_alone():
    from services.memory import bound_tokenizer_word_cache

    assert bound_tokenizer_word_cache(object(), 10) is False


@pytest.mark.parametrize("threads, copies_added", [(2, 0), (6, 4)])
def test_document_threads_bound_the_copies_vllm_s_tokenizer_pool_keeps(
    default_model_dir: Path, threads: int, copies_added: int
) -> None:
    """Twelve uploads read at once: with DOCUMENT_THREADS=2 the pool (made with 2 copies, as vLLM's
    renderer makes it) lends no more than it holds; with 6 threads (asyncio's default executor on
    two cores) it keeps 4 more, ~8 MB each, for good."""
    import asyncio
    import threading

    from transformers import AutoTokenizer
    from vllm.tokenizers.hf import maybe_make_thread_pool

    from services.chat.attachments import DocumentThreads
    from services.memory.word_caches import WordCacheBound, _free_variables

    tokenizer = AutoTokenizer.from_pretrained(str(default_model_dir))
    maybe_make_thread_pool(tokenizer, 2)
    borrow = _free_variables(type(tokenizer).encode)["_borrow_from_pool"]
    before = len(WordCacheBound(tokenizer, 0).copies())

    together = threading.Barrier(threads, timeout=60)  # every allowed thread holds a copy at once

    def read_one_upload() -> None:  # a thread that tokenizes for a while, as reading a document does
        with borrow():
            together.wait()

    async def twelve_uploads() -> None:  # 12: the barrier fills in rounds of 2 or 6
        runner = DocumentThreads(threads)
        await asyncio.gather(*(runner.run(read_one_upload) for _ in range(12)))

    asyncio.run(twelve_uploads())
    assert len(WordCacheBound(tokenizer, 0).copies()) - before == copies_added
