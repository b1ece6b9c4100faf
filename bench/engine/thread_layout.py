"""CPU thread layout of vLLM's worker: chat time to first token at 50 users, and document prefill speed.

    .venv/bin/python bench/engine/thread_layout.py                                    # ~35 minutes here
    .venv/bin/python bench/engine/thread_layout.py --duration 60 --users 10 --repeats 1   # a validation run

Layouts (VLLM_CPU_OMP_THREADS_BIND and VLLM_CPU_NUM_OF_RESERVED_CPU, vLLM's own variables):
    auto      vLLM's default: the worker's OpenMP threads on all cores but one, which is left to the
              app and EngineCore (here: 1 thread on 1 core)
    all       every core for the worker (here 0-1), nothing reserved
    nobind    no binding: torch's own thread count, the OS places the threads
Each layout gets a fresh `chainlit run app.py` (default model, default settings) and is measured
twice in turn (ABCABC) so that drift of the machine hits all of them alike:
    prefill   a ~1,800-token message with a one-token answer on the idle service: tokens per second
    chat      --users people asking short questions (64-token answers, 1-3 s between turns) for
              --duration seconds: time to first token P50/P95 of answered turns, refused turns
Writes bench/out/thread-layout-<time>/summary.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.common import PROMPTS_FILE, machine_info, percentile
from harness.chat_client import ChatClient
from harness.documents import long_document
from harness.server import AppServer
from services.config import Settings
from services.engine.backends.local import ensure_default_model

LAYOUTS: dict[str, dict[str, str]] = {
    "auto": {"VLLM_CPU_OMP_THREADS_BIND": "auto"},
    "all": {
        "VLLM_CPU_OMP_THREADS_BIND": f"0-{(os.cpu_count() or 1) - 1}",
        "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
    },
    "nobind": {"VLLM_CPU_OMP_THREADS_BIND": "nobind"},
}
QUESTIONS = json.loads(PROMPTS_FILE.read_text())["short"]


def prompt_tokens(text: str) -> int:
    """Tokens of `text` as the app sends it: the default system prompt and the message, templated."""
    from transformers import AutoTokenizer

    settings = Settings.from_env({})
    tokenizer = AutoTokenizer.from_pretrained(ensure_default_model(settings))
    messages = [{"role": "system", "content": settings.system_prompt}, {"role": "user", "content": text}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return len(ids if isinstance(ids, list) else ids["input_ids"])


async def prefill_tokens_per_second(server: AppServer, seeds: tuple[int, ...] = (1, 2, 3)) -> float:
    """Median prefill speed of long messages on the idle service (their prompt tokens / TTFT)."""
    speeds = []
    for seed in seeds:
        text = long_document(1300, seed=seed) + "\n\nSummarize."
        client = ChatClient(server.base_url)
        await client.connect()
        try:
            await client.update_settings(max_new_tokens=1, temperature=0)
            reply = await client.ask(text, timeout=600)
        finally:
            await client.close()
        assert reply.ttft_seconds, reply.final
        speeds.append(prompt_tokens(text) / reply.ttft_seconds)
    return sorted(speeds)[len(speeds) // 2]


async def chat_load(server: AppServer, users: int, duration: float) -> dict[str, Any]:
    """`users` people asking short questions for `duration` seconds; TTFT of answered turns."""
    deadline = time.monotonic() + duration
    ttfts: list[float] = []
    refused = answered = 0

    async def person(number: int) -> None:
        nonlocal refused, answered
        rng = random.Random(number)
        client = ChatClient(server.base_url)
        await client.connect()
        await client.update_settings(max_new_tokens=64)
        try:
            while time.monotonic() < deadline:
                reply = await client.ask(rng.choice(QUESTIONS), timeout=600)
                if reply.refused:
                    refused += 1
                elif reply.ttft_seconds is not None:
                    answered += 1
                    ttfts.append(reply.ttft_seconds)
                await asyncio.sleep(rng.uniform(1, 3))
        finally:
            await client.close()

    await asyncio.gather(*(person(i) for i in range(users)), return_exceptions=True)
    return {
        "answered": answered,
        "refused": refused,
        "ttft_seconds": {f"p{q}": round(percentile(ttfts, q) or 0, 3) for q in (50, 95)},
    }


def measure(name: str, options: argparse.Namespace, out: Path, repeat: int) -> dict[str, Any]:
    server = AppServer(LAYOUTS[name], out / f"server-{name}-{repeat}.log").start(timeout=900)
    try:
        prefill = asyncio.run(prefill_tokens_per_second(server))
        chat = asyncio.run(chat_load(server, options.users, options.duration))
    finally:
        server.stop()
    result = {"layout": name, "repeat": repeat, "prefill_tokens_per_second": round(prefill, 1), **chat}
    print(json.dumps(result), flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--users", type=int, default=50)
    parser.add_argument("--duration", type=float, default=180.0, help="Seconds of chat load per layout.")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--layouts", default=",".join(LAYOUTS))
    parser.add_argument("--out", type=Path, default=None)
    options = parser.parse_args()
    out = options.out or ROOT / "bench" / "out" / f"thread-layout-{datetime.now():%Y%m%d-%H%M%S}"
    out.mkdir(parents=True, exist_ok=True)
    names = [n for n in options.layouts.split(",") if n]
    report: dict[str, Any] = {"run": {"command": " ".join(sys.argv), "machine_before": machine_info()}}
    runs = [measure(name, options, out, repeat) for repeat in range(options.repeats) for name in names]
    for name in names:
        mine = [r for r in runs if r["layout"] == name]
        report[name] = {
            "settings": LAYOUTS[name],
            "prefill_tokens_per_second": [r["prefill_tokens_per_second"] for r in mine],
            "chat_ttft_p50_seconds": [r["ttft_seconds"]["p50"] for r in mine],
            "chat_ttft_p95_seconds": [r["ttft_seconds"]["p95"] for r in mine],
            "answered": sum(r["answered"] for r in mine),
            "refused": sum(r["refused"] for r in mine),
        }
    report["run"]["machine_after"] = machine_info()
    (out / "summary.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
