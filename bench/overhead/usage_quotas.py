"""Usage and quotas benchmark: what keeping usage and checking budgets costs, measured on this machine.

    .venv/bin/python bench/overhead/usage_quotas.py --save-results   # verdict run (~10 min on 2 cores)
    .venv/bin/python bench/overhead/usage_quotas.py --quick          # smoke run

Three numbers, one run:
  1. TTFT with usage accounting and quota checks on and off, side by side: two app servers on the
     default model, password sign-in (usage is kept for signed-in people), one signed in as a person of
     role user with a finite budget (USAGE_ACCOUNTING=true, the defaults) and one with
     USAGE_ACCOUNTING=false. The same conversations alternate between them turn by turn, so both see
     the same machine state. TTFT = message sent -> first token seen by the client. Ratio = on / off
     at P50 (target <= 1.02x).
  2. Database bytes per 1,000 turns, SQLite file growth and PostgreSQL `pg_total_relation_size`, in
     the worst case (every turn a new person-day row: 1,000 rows) and a typical day (1,000 turns by 50
     people: 50 rows), written through the app's own UsageStore.
  3. The in-process cost of the budget check (cached) and of counting one turn, in microseconds.
Writes a JSON summary to bench/out/ (and bench/results/overhead/ with --save-results).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from sqlalchemy import text

from bench.common import OUT, PROMPTS_FILE, ROOT, machine_info, percentile, result_path
from harness.chat_client import ChatClient
from harness.postgres import PostgresCluster, postgres_bin_dir
from harness.server import AppServer
from harness.tiny_model import build_tiny_model
from services.config import Settings
from services.engine.backends.local import ensure_default_model
from services.history.database import create_engine, file_size_bytes, sqlite_path
from services.history.migrations import migrate
from services.usage import UsageLedger, UsageStore

PERSON = ("bench-user", "bench-password-1")


def prompts() -> list[str]:
    return list(json.loads(PROMPTS_FILE.read_text())["short"])


def add_person(data_dir: Path) -> None:
    env = {**os.environ, "DATA_DIR": str(data_dir)}
    command = [sys.executable, "-m", "services.accounts", "add", PERSON[0]]
    subprocess.run(
        command,
        cwd=ROOT,
        env=env,
        input=PERSON[1] + "\n",
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )


async def ttft_side_by_side(
    on: AppServer, off: AppServer, conversations_n: int, turns: int, turn_timeout: float = 600
) -> dict[str, Any]:
    """Alternate the same turns between the two servers; return each side's TTFTs."""
    texts = prompts()
    random.Random(7).shuffle(texts)
    results: dict[str, list[float]] = {"on": [], "off": []}
    for c in range(conversations_n):
        clients = {"on": ChatClient(on.base_url, *PERSON), "off": ChatClient(off.base_url, *PERSON)}
        for client in clients.values():
            await client.connect()
        for t in range(turns):
            order = ("on", "off") if (c + t) % 2 == 0 else ("off", "on")
            for side in order:
                reply = await clients[side].ask(texts[(c * turns + t) % len(texts)], timeout=turn_timeout)
                assert not reply.refused, reply.final
                if c or t:  # the very first turn of each server warms its kernels
                    results[side].append(reply.ttft_seconds or float("nan"))
        for client in clients.values():
            await client.close()
    summary: dict[str, Any] = {}
    for side, values in results.items():
        summary[side] = {"n": len(values), **{f"p{q}": percentile(values, q) for q in (50, 90, 99)}}
    summary["ratio_p50_on_over_off"] = summary["on"]["p50"] / summary["off"]["p50"]
    return summary


async def rows_bytes(settings: Settings, size: Any, day_rows: int, people: int) -> dict[str, float]:
    """Bytes the database grows by for 1,000 turns: `people` people, each turn counted as the app
    counts it; `day_rows` distinct person-days (1,000: every turn a new row)."""
    engine = create_engine(settings)
    await migrate(engine)
    store = UsageStore(engine)
    try:
        result = {}
        for label, rows in (("worst_1000_rows", day_rows), ("typical_50_people", people)):
            ledger = UsageLedger(settings, store)
            before = await size(engine)
            for turn in range(1000):
                who = f"{label}-person-{turn % rows}"
                day = (
                    f"2026-{1 + turn % rows // 28 % 12:02d}-{1 + turn % 28:02d}"
                    if rows > people
                    else "2026-12-05"
                )
                ledger.batch.add(who, day, prompt_tokens=420, answer_tokens=180, turns=1)
                if turn % 100 == 99:
                    await ledger.flush()  # as the app does every USAGE_FLUSH_SECONDS
            await ledger.flush()
            result[f"{label}_bytes"] = await size(engine) - before
        return result
    finally:
        await engine.dispose()


def sqlite_size(settings: Settings):
    async def size(engine: Any) -> float:
        async with engine.connect() as connection:
            await connection.execute(text("PRAGMA wal_checkpoint(TRUNCATE)"))
        path = sqlite_path(settings)
        return float(file_size_bytes(path)) if path else 0.0

    return size


async def postgres_size(engine: Any) -> float:
    async with engine.connect() as connection:
        value = await connection.execute(text("SELECT pg_total_relation_size('usage_days')"))
        return float(value.scalar() or 0)


async def check_micros(settings: Settings) -> dict[str, float]:
    """A cached budget check and one turn's counting, timed in this process (SQLite behind)."""
    engine = create_engine(settings)
    await migrate(engine)
    ledger = UsageLedger(settings, UsageStore(engine))
    try:
        await ledger.check("user:someone")  # loads once
        n = 20000
        started = time.perf_counter()
        for _ in range(n):
            await ledger.check("user:someone")
        checked = (time.perf_counter() - started) / n * 1e6
        started = time.perf_counter()
        for _ in range(n):
            ledger.started("user:someone", False, 0)
            ledger.used("user:someone", 420, 180)
        counted = (time.perf_counter() - started) / n * 1e6
        return {"budget_check_us": round(checked, 2), "count_one_turn_us": round(counted, 2)}
    finally:
        await engine.dispose()


async def database_costs() -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as folder:
        settings = Settings.from_env({"DATA_DIR": folder})
        costs: dict[str, Any] = {"sqlite": await rows_bytes(settings, sqlite_size(settings), 1000, 50)}
        costs["in_process"] = await check_micros(Settings.from_env({"DATA_DIR": folder + "/micro"}))
    if postgres_bin_dir() is None:
        costs["postgresql"] = "not installed"
        return costs
    cluster = PostgresCluster().start()
    try:
        settings = Settings.from_env({"DATABASE_URL": cluster.create_database("usage_bench")})
        costs["postgresql"] = await rows_bytes(settings, postgres_size, 1000, 50)
    finally:
        cluster.remove()
    return costs


def start_servers(model: str, off_first: bool = False) -> tuple[AppServer, AppServer]:
    logs = ROOT / "artifacts" / "logs"
    context = {"MAX_MODEL_LEN": "4096"} if model else {}  # the tiny model's positions
    common = {
        **context,
        "MODEL": model,
        "MAX_NEW_TOKENS": "32",
        "TEMPERATURE": "0",
        "AUTH_MODE": "password",
        "ADMIN_USERNAME": "admin",
        "ADMIN_PASSWORD": "admin-password-1",
        # one person sends every turn, faster than a person types: the per-person rates stay out
        "USER_MESSAGES_PER_MINUTE": "100000",
        "USER_TOKENS_PER_MINUTE": "0",
    }
    servers = []
    sides = [("on", "true"), ("off", "false")]
    for side, accounting in reversed(sides) if off_first else sides:  # which engine starts first
        data_dir = Path(tempfile.mkdtemp(prefix=f"usage-bench-{side}-"))
        add_person(data_dir)
        env = {**common, "USAGE_ACCOUNTING": accounting, "DATA_DIR": str(data_dir)}
        servers.append(AppServer(env, logs / f"bench-usage-{side}.log").start(timeout=1800))
    return (servers[1], servers[0]) if off_first else (servers[0], servers[1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer turns (a smoke run)")
    parser.add_argument("--save-results", action="store_true", help="also write bench/results/overhead/")
    parser.add_argument("--tiny", action="store_true", help="the tiny test model (2 layers), not the default")
    parser.add_argument("--off-first", action="store_true", help="start the server without accounting first")
    options = parser.parse_args()
    conversations_n, turns = (2, 4) if options.quick else (8, 6)
    costs = asyncio.run(database_costs())
    print(json.dumps({"database": costs}), flush=True)
    model = ""
    if options.tiny:
        model = str(build_tiny_model(ensure_default_model(Settings.from_env({})), OUT / "tiny-llama"))
    on, off = start_servers(model, options.off_first)
    try:
        ttft = asyncio.run(ttft_side_by_side(on, off, conversations_n, turns))
    finally:
        off.stop()
        on.stop()
    summary = {
        "benchmark": "usage_quotas",
        "quick": options.quick,
        "at": datetime.now(UTC).isoformat(),
        "ttft_s": ttft,
        "database": costs,
        "machine": machine_info(),
        "model": "tiny" if options.tiny else "default",
        "load_average": os.getloadavg(),
        "command": "python bench/overhead/usage_quotas.py"
        + (" --quick" if options.quick else "")
        + (" --tiny" if options.tiny else "")
        + (" --off-first" if options.off_first else ""),
    }
    paths = [OUT / f"usage-quotas-{datetime.now():%Y%m%d-%H%M%S}.json"]
    if options.save_results:
        paths.append(result_path("overhead", "usage-quotas"))
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
