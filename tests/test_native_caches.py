"""Library caches that fill slowly stop growing once settled (native_caches.py, engine/lifespan.py).

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

import pytest

from harness.server import ROOT

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="measures glibc's heap")

NUMPY_WORKLOAD = """
import json, random, sys
import numpy as np
from services.observability.maintenance import malloc_info
from services.observability.native_caches import fill_numpy_buffer_cache

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
import json, random, string, sys
from transformers import AutoTokenizer
from services.observability.maintenance import malloc_info
from services.engine.lifespan import bound_tokenizer_word_cache

tokenizer = AutoTokenizer.from_pretrained(sys.argv[2])
if sys.argv[1] == "settled":
    assert bound_tokenizer_word_cache(tokenizer, 200)
random.seed(0)
made_up = lambda: "".join(random.choices(string.ascii_lowercase, k=random.randint(3, 10)))
tokenizer.encode(" ".join(made_up() for _ in range(400)))  # fills a bound of 200
before = malloc_info()["in_use_bytes"]
for _ in range(300):  # 3,000 words never seen before
    tokenizer.encode(" ".join(made_up() for _ in range(10)), add_special_tokens=False)
print(json.dumps(malloc_info()["in_use_bytes"] - before))
"""


def _growth(script: str, *args: str) -> int:
    done = subprocess.run([sys.executable, "-c", script, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, check=True)  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_filled_numpy_buffer_cache_does_not_grow_with_new_array_lengths():
    unsettled, settled = _growth(NUMPY_WORKLOAD, "unsettled"), _growth(NUMPY_WORKLOAD, "settled")
    assert unsettled > 200_000, f"the control arm should fill numpy's cache, grew {unsettled} B"
    assert settled < 32_000, f"numpy's filled cache still grew {settled} B"


def test_a_bounded_tokenizer_word_cache_does_not_grow_with_new_words(default_model_dir: Path):
    model = str(default_model_dir)
    unsettled = _growth(TOKENIZER_WORKLOAD, "unsettled", model)
    settled = _growth(TOKENIZER_WORKLOAD, "settled", model)
    assert unsettled > 300_000, f"the control arm should fill the word cache, grew {unsettled} B"
    assert settled < 32_000, f"the bounded word cache still grew {settled} B"


def test_a_tokenizer_without_a_word_cache_is_left_alone():
    from services.engine.lifespan import bound_tokenizer_word_cache

    assert bound_tokenizer_word_cache(object(), 10) is False
