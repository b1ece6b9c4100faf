"""History benchmark: what keeping conversations costs, measured on this machine.

    .venv/bin/python bench/history/persistence.py            # verdict run (~10 min on 2 cores)
    .venv/bin/python bench/history/persistence.py --quick    # smoke run (~5 min)

Three numbers, one run, the default model:
  1. TTFT with persistence on and off, side by side: two app servers (CHAT_HISTORY=true on SQLite,
     CHAT_HISTORY=false), both signed in as the local user; the same conversations (several turns
     each, prompts from bench/data/prompts.json) alternate between them turn by turn, so both see
     the same machine state. Only one server generates at a time; the other's engine idles.
     TTFT = message sent -> first token seen by the client. Ratio = on / off at P50.
  2. Resume of a 200-message conversation: stored through Chainlit's data layer into the "on"
     server's database, then opened as a reloaded page does: time until the stored messages arrive
     (`resume_thread`), then the first token of the next answer (the model gets the history
     back, trimmed to its context).
  3. Database size per 1,000 messages: SQLite file growth while storing messages of the sizes
     above (user prompts, ~150-word answers), through the same data layer.
Writes a JSON summary to bench/out/ (and --json PATH).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from chainlit.context import init_http_context
from chainlit.user import User

from bench.common import PROMPTS_FILE, ROOT, machine_info, percentile
from harness.chat_client import ChatClient
from harness.server import AppServer
from services.config import Settings
from services.history import conversations
from services.history.database import file_size_bytes, sqlite_path
from services.history.resume import ANSWER_METADATA
from services.history.service import History

ANSWER_WORDS = 150


def prompts() -> list[str]:
    data = json.loads(PROMPTS_FILE.read_text())
    return list(data["short"])


async def ttft_side_by_side(
    on: AppServer, off: AppServer, conversations_n: int, turns: int
) -> dict[str, Any]:
    """Alternate the same turns between the two servers; return each side's TTFTs."""
    texts = prompts()
    random.Random(7).shuffle(texts)
    results: dict[str, list[float]] = {"on": [], "off": []}
    for c in range(conversations_n):
        clients = {"on": ChatClient(on.base_url), "off": ChatClient(off.base_url)}
        for client in clients.values():
            await client.connect()
        for t in range(turns):
            order = ("on", "off") if (c + t) % 2 == 0 else ("off", "on")
            text = texts[(c * turns + t) % len(texts)]
            for side in order:
                reply = await clients[side].ask(text, timeout=180)
                if c or t:  # the very first turn of each server warms its kernels
                    results[side].append(reply.ttft_seconds or float("nan"))
        for client in clients.values():
            await client.close()
    summary = {}
    for side, values in results.items():
        summary[side] = {"n": len(values), **{f"p{q}": percentile(values, q) for q in (50, 90, 99)}}
    summary["ratio_p50_on_over_off"] = summary["on"]["p50"] / summary["off"]["p50"]
    return summary


def message(i: int, texts: list[str], rng: random.Random) -> tuple[str, str]:
    if i % 2 == 0:
        return "user_message", texts[i // 2 % len(texts)]
    return "assistant_message", " ".join(
        " ".join(rng.choice(texts).split()[:8]) for _ in range(ANSWER_WORDS // 8)
    )


async def store_conversation(history: History, user_id: str, messages: int, rng: random.Random) -> str:
    """A conversation of `messages` messages stored the way the app stores them."""
    layer = history.layer
    assert layer is not None
    texts = prompts()
    thread_id = str(uuid.uuid4())
    await layer.update_thread(thread_id, name=texts[0][:40], user_id=user_id)
    start = datetime.now(UTC) - timedelta(hours=1)
    for i in range(messages):
        kind, text = message(i, texts, rng)
        await layer.create_step(
            {
                "id": str(uuid.uuid4()),
                "threadId": thread_id,
                "type": kind,
                "output": text,
                "streaming": False,
                "name": "User" if kind == "user_message" else "vLLM Chat",
                "command": "",
                "defaultOpen": False,
                "createdAt": conversations.timestamp(start + timedelta(seconds=i)),
                "metadata": dict(ANSWER_METADATA) if kind == "assistant_message" else {},
            }
        )
    return thread_id


async def resume_and_size(on: AppServer, repeats: int) -> dict[str, Any]:
    """Resume timings of a 200-message conversation, and database bytes per 1,000 messages."""
    probe = ChatClient(on.base_url)
    await probe.connect()  # makes the local user's row
    await probe.close()
    settings = Settings.from_env({"DATA_DIR": on.env["DATA_DIR"]})
    history = History(settings, keep_conversations=True, use_database=True)
    await history.start()
    init_http_context()
    rng = random.Random(11)
    try:
        user = await history.layer.create_user(User(identifier="local", metadata={"role": "admin"}))  # type: ignore[union-attr]
        assert user is not None
        path = sqlite_path(settings)
        assert path is not None
        before = file_size_bytes(path)
        threads = [await store_conversation(history, user.id, 200, rng) for _ in range(5)]
        per_thousand = (file_size_bytes(path) - before) / 1000  # 5 x 200 messages
        shown = []
        first_token = []
        for thread_id in threads[:repeats]:
            client = ChatClient(on.base_url, cookie=probe.cookie)
            started = time.monotonic()
            thread = await client.resume(thread_id, timeout=60)
            shown.append(time.monotonic() - started)
            assert len(thread["steps"]) == 200
            reply = await client.ask("Summarize what we discussed in one sentence.", timeout=300)
            first_token.append(reply.ttft_seconds or float("nan"))
            await client.close()
    finally:
        await history.stop()
    return {
        "messages": 200,
        "messages_shown_s": {f"p{q}": percentile(shown, q) for q in (50, 90)},
        "next_answer_ttft_s": {f"p{q}": percentile(first_token, q) for q in (50, 90)},
        "database_bytes_per_1000_messages": round(per_thousand * 1000),
        "answer_words": ANSWER_WORDS,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer turns (a smoke run)")
    parser.add_argument("--json", type=Path, help="also write the summary here")
    options = parser.parse_args()
    conversations_n, turns, repeats = (3, 4, 2) if options.quick else (8, 6, 5)
    logs = ROOT / "artifacts" / "logs"
    common = {"MODEL": "", "MAX_NEW_TOKENS": "64", "TEMPERATURE": "0"}
    on = AppServer({**common, "CHAT_HISTORY": "true"}, logs / "bench-history-on.log").start(timeout=900)
    off = AppServer({**common, "CHAT_HISTORY": "false"}, logs / "bench-history-off.log").start(timeout=900)
    try:
        ttft = asyncio.run(ttft_side_by_side(on, off, conversations_n, turns))
        print(json.dumps({"ttft_s": ttft}), flush=True)  # kept in the log even if a later part fails
        off.stop()
        resume = asyncio.run(resume_and_size(on, repeats))
    finally:
        off.stop()
        on.stop()
    summary = {
        "benchmark": "history",
        "quick": options.quick,
        "at": datetime.now(UTC).isoformat(),
        "ttft_s": ttft,
        "resume": resume,
        "machine": machine_info(),
        "command": "python bench/history/persistence.py" + (" --quick" if options.quick else ""),
    }
    out = ROOT / "bench" / "out" / f"history-{datetime.now():%Y%m%d-%H%M%S}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    for path in (out, options.json):
        if path is not None:
            path.write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
