"""A retention sweep gives back the heap it takes: rounds do not ratchet the app's memory.

The real History on SQLite (pooled connections, page caches), conversations stored through
Chainlit's data layer and copied between rounds; bench/history/retention.py is the full-size run.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

import pytest

from bench.history.retention import SETTLING_ROUNDS, run

# heap growth over rounds: per commit, test_history.py's retention sweeps
pytestmark = pytest.mark.long


def test_retention_rounds_do_not_ratchet_the_heap(tmp_path: Path) -> None:
    options = argparse.Namespace(base=60, messages=4, add=600, keep=100, rounds=SETTLING_ROUNDS + 5)
    summary = asyncio.run(run(options, tmp_path))
    rounds = summary["rounds"]
    assert all(row["deleted"] == 600 for row in rounds[1:]), "each round deletes what was added"
    settled = rounds[SETTLING_ROUNDS:]
    growth = settled[-1]["glibc_in_use_mb"] - settled[0]["glibc_in_use_mb"]
    sqlite = {row["sqlite_in_use_mb"] for row in settled}
    # An unclosed connection with SQLite's default 2 MB page cache grew it by 2.5 MB a round.
    assert growth < 0.5, f"the heap in use grew {growth:.2f} MB over {len(settled)} rounds: {rounds}"
    assert max(sqlite) - min(sqlite) < 0.25, f"SQLite's heap moved between rounds: {sorted(sqlite)}"
    assert summary["anon_mb_per_round_after_settling"][0] < 0.5
