"""What a retention sweep costs the app's heap, and whether sweeps ratchet it.

    .venv/bin/python bench/history/retention.py                  # ~2 minutes, no engine
    .venv/bin/python bench/history/retention.py --rounds 3 --add 600 --keep 200   # quick

The soak signs every simulated user in as one identity, so by a retention sweep one user holds
hundreds to thousands of conversations beyond HISTORY_MAX_CONVERSATIONS (thousands when sweeps
were hourly), and the sweep deletes them a batch per maintenance round. This bench repeats that
in one process, with the app's own History (SQLite, its pooled connections and page caches) and
no engine:
  1. stores `--base` conversations through Chainlit's data layer (the rows the app writes);
  2. each round adds `--add` copies of them (fresh ids, newer messages: an hour of the soak),
     then sweeps with the cap at `--keep`: `History.retention_round()` as maintenance rounds call
     it (a batch per round) until it deletes nothing, then `malloc_trim` as those rounds do;
  3. after each round records the process's anonymous memory, glibc's in-use and free bytes,
     SQLite's heap and its high-water mark during the round, and the database's size.
The first rounds fill the page caches and the database file; "ratchet" is the Theil-Sen slope of
anonymous memory per round over the rounds after them. Writes JSON to bench/out/ (and --json).
"""

from __future__ import annotations

import _sqlite3
import argparse
import asyncio
import ctypes
import json
import os
import random
import sqlite3
import sys
import tempfile
import time
from contextlib import closing
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from chainlit.context import init_http_context
from chainlit.user import User

from bench.common import ROOT, machine_info
from bench.history.persistence import store_conversation
from services.config import Settings
from services.history.database import file_size_bytes, sqlite_memory_bytes, sqlite_path
from services.history.service import History
from services.observability.maintenance import malloc_info, malloc_trim
from services.observability.memory import proc_status_bytes
from services.observability.series import theil_sen_interval

MB = 1024 * 1024
SETTLING_ROUNDS = 2  # page caches and the file reach their size in the first rounds
COPY_COLUMNS = (
    '"name", "type", "parentId", "streaming", "waitForAnswer", "isError", "metadata", "tags", "input", '
    '"output", "command", "start", "end", "generation", "showInput", "language", "indent", "defaultOpen", '
    '"autoCollapse", "modes", "icon"'
)


def history_at(folder: Path, keep: int) -> History:
    env = {"DATA_DIR": str(folder), "HISTORY_MAX_CONVERSATIONS": str(keep), "HISTORY_RETENTION_DAYS": "180"}
    return History(Settings.from_env(env), keep_conversations=True, use_database=True)


async def build_base(folder: Path, conversations_n: int, messages: int) -> Path:
    """`conversations_n` conversations of one user, stored through Chainlit's data layer."""
    history = history_at(folder, 0)
    await history.start()
    init_http_context()  # Chainlit's data layer expects a Chainlit context
    assert history.layer is not None
    user = await history.layer.create_user(User(identifier="local", metadata={"role": "user"}))
    assert user is not None
    rng = random.Random(3)
    for _ in range(conversations_n):
        await store_conversation(history, user.id, messages, rng)
    await history.stop()
    path = sqlite_path(history.settings)
    assert path is not None
    return path


def add_copies(live: Path, base: Path, copies: int, round_index: int) -> None:
    """Copy every base conversation `copies` times into the live database, with fresh ids and
    messages newer than any copied before (so the cap keeps the newest and deletes the rest)."""
    with closing(sqlite3.connect(live, timeout=30)) as db, db:  # `with db` commits, closing() closes
        db.execute("ATTACH ? AS base", (str(base),))
        db.execute("INSERT OR IGNORE INTO users SELECT * FROM base.users")
        for copy in range(copies):
            tag = f"-r{round_index}c{copy}"
            minutes = round_index * 1000 + copy
            db.execute(
                'INSERT INTO threads SELECT "id" || ?, "createdAt", "name", "userId", "userIdentifier", '
                '"tags", "metadata" FROM base.threads',
                (tag,),
            )
            db.execute(
                f'INSERT INTO steps ("id", "threadId", "createdAt", {COPY_COLUMNS}) SELECT "id" || ?, '
                f'"threadId" || ?, strftime(\'%Y-%m-%dT%H:%M:%fZ\', "createdAt", ?), {COPY_COLUMNS} '
                "FROM base.steps",
                (tag, tag, f"+{minutes} minutes"),
            )


def sqlite_highwater(reset: bool) -> int:
    """SQLite's heap high-water mark in this process (the library Python's sqlite3 uses)."""
    library = ctypes.CDLL(_sqlite3.__file__)
    library.sqlite3_memory_highwater.restype = ctypes.c_int64
    return int(library.sqlite3_memory_highwater(int(reset)))


def rounded(row: dict[str, Any]) -> dict[str, Any]:
    return {name: round(value, 2) if isinstance(value, float) else value for name, value in row.items()}


def measure(history: History, round_index: int, deleted: int, seconds: float) -> dict[str, Any]:
    heap = malloc_info() or {}
    path = sqlite_path(history.settings)
    return {
        "round": round_index,
        "deleted": deleted,
        "seconds": round(seconds, 2),
        "anon_mb": proc_status_bytes(os.getpid(), ["RssAnon"]).get("RssAnon", 0) / MB,
        "glibc_in_use_mb": heap.get("in_use_bytes", 0) / MB,
        "glibc_free_in_heaps_mb": heap.get("free_in_heaps_bytes", 0) / MB,
        "sqlite_highwater_mb": sqlite_highwater(reset=True) / MB,
        "sqlite_in_use_mb": (sqlite_memory_bytes() or 0) / MB,
        "python_blocks": sys.getallocatedblocks(),
        "database_mb": file_size_bytes(path) / MB if path else None,
    }


async def run(options: argparse.Namespace, folder: Path) -> dict[str, Any]:
    base = await build_base(folder / "base", options.base, options.messages)
    history = history_at(folder / "live", options.keep)
    await history.start()
    live = sqlite_path(history.settings)
    assert live is not None
    copies = max(1, round(options.add / options.base))
    rounds = []
    for index in range(options.rounds):
        await asyncio.to_thread(add_copies, live, base, copies, index)
        history._retention_at = None  # the sweep interval has passed
        sqlite_highwater(reset=True)
        started = time.monotonic()
        deleted = 0
        sweep_rounds = 0
        while batch := await history.retention_round():  # maintenance rounds until the sweep is done
            deleted += batch
            sweep_rounds += 1
        seconds = time.monotonic() - started
        await asyncio.to_thread(malloc_trim)
        rounds.append({**measure(history, index, deleted, seconds), "maintenance_rounds": sweep_rounds})
        print(json.dumps(rounded(rounds[-1])), flush=True)
    await history.stop()
    settled = rounds[SETTLING_ROUNDS:]
    slope = theil_sen_interval([r["round"] for r in settled], [r["anon_mb"] for r in settled])
    return {
        "options": {name: value for name, value in vars(options).items() if name != "json"},
        "conversations_added_per_round": copies * options.base,
        "rounds": [rounded(row) for row in rounds],
        "anon_mb_per_round_after_settling": [round(value, 3) for value in slope],
        "machine": machine_info(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--base", type=int, default=500, help="conversations stored through the data layer")
    parser.add_argument("--messages", type=int, default=4, help="messages per conversation")
    parser.add_argument("--add", type=int, default=3500, help="conversations added before each round")
    parser.add_argument("--keep", type=int, default=1000, help="HISTORY_MAX_CONVERSATIONS")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--json", type=Path, default=None)
    options = parser.parse_args()
    if options.rounds < SETTLING_ROUNDS + 3:
        parser.error(f"--rounds must be at least {SETTLING_ROUNDS + 3}")
    with tempfile.TemporaryDirectory(prefix="retention-") as folder:
        summary = asyncio.run(run(options, Path(folder)))
    print(json.dumps({k: v for k, v in summary.items() if k != "rounds"}, indent=1))
    out = options.json or ROOT / "bench" / "out" / f"retention-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
