"""Overhead benchmark: the same requests through the app (socket.io) and straight into the engine.

    .venv/bin/python bench/overhead/app_layer.py            # full run (~8 min on 2 cores)
    .venv/bin/python bench/overhead/app_layer.py --quick    # smoke run (~4 min)

How it is measured (one run, two phases, never two engines at once):
  1. app path: `chainlit run app.py` on a loopback port with TEMPERATURE=0 and
     MAX_NEW_TOKENS=N; each request is a fresh chat session (tests/chat_client.py,
     connected before the clock starts), one message; TTFT = message sent ->
     first token seen by the client (`stream_start`), end = final message seen.
     Then the server is stopped.
  2. engine path: an engine with the same settings in this process
     (services.engine.engine_lifespan); the same prompts with the app's system
     prompt go to ChatEngine.generate; TTFT = call -> first text delta.
Both paths run the same prompts in the same order at each concurrency, after
two unmeasured warm-up requests. Output tokens are counted by re-tokenizing the
final text with the model's tokenizer in both paths. tokens/s = all output
tokens / wall time of the phase; the ratio is app / engine (1.0 = no overhead).

Each phase also records where the CPU went: busy share of each core and CPU
seconds per second of each process (this benchmark, the app server, vLLM's
EngineCore and worker). vLLM binds its worker to core 0, so everything else
shares core 1: this shows whether core 1 is saturated on one path.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.common import (
    PROMPTS_FILE,
    machine_info,
    percentile,
    process_label,
    reap_children,
    run_until_signalled,
)
from harness.chat_client import ChatClient
from harness.server import AppServer
from services.config import Settings
from services.engine import SamplingSettings, engine_lifespan

TARGET_TOKENS_RATIO = 0.95  # app tokens/s / engine tokens/s, at least
TARGET_TTFT_ADDED_MS = 15.0  # app TTFT P50 - engine TTFT P50, at most
WARM_UP_REQUESTS = 2


@dataclass
class Sample:
    ttft_s: float
    total_s: float
    text: str


Ask = Callable[[str], Awaitable[Sample]]


def cpu_seconds(app_pid: int | None) -> dict[str, float]:
    """Busy seconds of each core, and CPU seconds of this process and of each process under it, by role."""
    seconds: dict[str, float] = {}
    for index, core in enumerate(psutil.cpu_times(percpu=True)):
        seconds[f"core {index} busy"] = sum(core) - core.idle - getattr(core, "iowait", 0.0)
    me = psutil.Process()
    for process in [me, *me.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            role = "benchmark" if process is me else process_label(process, app_pid)
            times = process.cpu_times()
            seconds[role] = seconds.get(role, 0.0) + times.user + times.system
    return seconds


async def measured_phase(
    ask: Ask, prompts: list[str], concurrency: int, app_pid: int | None = None
) -> tuple[list[Sample], float, dict]:
    """run_phase, plus the CPU share (CPU seconds per wall second) of each core and process."""
    before = cpu_seconds(app_pid)
    samples, wall_s = await run_phase(ask, prompts, concurrency)
    after = cpu_seconds(app_pid)
    shares = {key: round((after[key] - before.get(key, 0.0)) / wall_s, 2) for key in after}
    return samples, wall_s, shares


async def run_phase(ask: Ask, prompts: list[str], concurrency: int) -> tuple[list[Sample], float]:
    """Send every prompt with `concurrency` workers; samples in prompt order and the wall time."""
    samples: list[Sample | None] = [None] * len(prompts)
    queue: asyncio.Queue[int] = asyncio.Queue()
    for index in range(len(prompts)):
        queue.put_nowait(index)

    async def worker() -> None:
        while not queue.empty():
            index = queue.get_nowait()
            samples[index] = await ask(prompts[index])

    started = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return [s for s in samples if s is not None], time.monotonic() - started


# --- the two paths -------------------------------------------------------------------
async def app_path(
    server: AppServer, prompts: list[str], concurrencies: list[int], timeout_s: float
) -> dict[int, tuple[list[Sample], float, dict]]:
    async def ask(prompt: str) -> Sample:
        client = ChatClient(server.base_url)
        await client.connect()
        try:
            reply = await client.ask(prompt, timeout=timeout_s)
        finally:
            await client.close()
        if reply.first_token_at is None or reply.done_at is None:
            raise RuntimeError(f"no streamed answer: {reply.final!r}")
        return Sample(reply.first_token_at - reply.sent_at, reply.done_at - reply.sent_at, reply.final or "")

    for prompt in prompts[:WARM_UP_REQUESTS]:
        await ask(prompt)
    app_pid = server.process.pid if server.process else None
    return {c: await measured_phase(ask, prompts, c, app_pid) for c in concurrencies}


async def engine_path(
    settings: Settings, prompts: list[str], concurrencies: list[int], max_new_tokens: int
) -> dict[int, tuple[list[Sample], float, dict]]:
    sampling = SamplingSettings(temperature=0.0, top_p=settings.top_p, max_new_tokens=max_new_tokens)
    counter = iter(range(1_000_000))

    async with engine_lifespan(settings) as engine:

        async def ask(prompt: str) -> Sample:
            messages = [
                {"role": "system", "content": settings.system_prompt},
                {"role": "user", "content": prompt},
            ]
            parts: list[str] = []
            first = None
            started = time.monotonic()
            stream = engine.generate(messages, sampling, f"overhead-{next(counter)}")
            async with contextlib.aclosing(stream):
                async for delta in stream:
                    if first is None:
                        first = time.monotonic()
                    parts.append(delta)
            if first is None:
                raise RuntimeError("no streamed answer")
            return Sample(first - started, time.monotonic() - started, "".join(parts))

        for prompt in prompts[:WARM_UP_REQUESTS]:
            await ask(prompt)
        return {c: await measured_phase(ask, prompts, c) for c in concurrencies}


# --- report --------------------------------------------------------------------------
def phase_stats(
    samples: list[Sample], wall_s: float, cpu_share: dict[str, float], count_tokens: Callable[[str], int]
) -> dict[str, Any]:
    tokens = [count_tokens(s.text) for s in samples]
    rates = [t / s.total_s for t, s in zip(tokens, samples, strict=True) if s.total_s > 0]
    ttfts = [s.ttft_s for s in samples]
    return {
        "requests": len(samples),
        "output_tokens": sum(tokens),
        "wall_s": round(wall_s, 2),
        "tokens_per_s": round(sum(tokens) / wall_s, 2),
        "per_request_tokens_per_s_p50": round(percentile(rates, 50) or 0.0, 2),
        "ttft_p50_ms": round((percentile(ttfts, 50) or 0.0) * 1000, 1),
        "ttft_p95_ms": round((percentile(ttfts, 95) or 0.0) * 1000, 1),
        "total_p50_s": round(percentile([s.total_s for s in samples], 50) or 0.0, 3),
        "cpu_share": cpu_share,
    }


def compare(app: dict[str, Any], direct: dict[str, Any], same_text: int) -> dict[str, Any]:
    ratio = app["tokens_per_s"] / direct["tokens_per_s"] if direct["tokens_per_s"] else 0.0
    added = app["ttft_p50_ms"] - direct["ttft_p50_ms"]
    return {
        "tokens_per_s_ratio": round(ratio, 3),
        "ttft_p50_added_ms": round(added, 1),
        "identical_answers": same_text,
        "target_met": ratio >= TARGET_TOKENS_RATIO and added <= TARGET_TTFT_ADDED_MS,
    }


def markdown(rows: list[dict[str, Any]]) -> str:
    header = "| Concurrency | Path | Requests | Output tok/s | Per-request tok/s P50 | TTFT P50 (ms) |"
    lines = [header + " TTFT P95 (ms) |", "|---:|---|---:|---:|---:|---:|---:|"]
    for row in rows:
        for path in ("engine", "app"):
            s = row[path]
            lines.append(
                f"| {row['concurrency']} | {path} | {s['requests']} | {s['tokens_per_s']:.1f} | "
                f"{s['per_request_tokens_per_s_p50']:.1f} | {s['ttft_p50_ms']:.0f} | {s['ttft_p95_ms']:.0f} |"
            )
    lines += [
        "",
        "| Concurrency | tokens/s app/engine | TTFT P50 added (ms) | Identical answers | Target |",
        "|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        c = row["comparison"]
        lines.append(
            f"| {row['concurrency']} | {c['tokens_per_s_ratio']:.3f}x | {c['ttft_p50_added_ms']:+.1f} | "
            f"{c['identical_answers']}/{row['app']['requests']} | {'met' if c['target_met'] else 'NOT met'} |"
        )
    roles = sorted({role for row in rows for path in ("engine", "app") for role in row[path]["cpu_share"]})
    lines += ["", "CPU seconds per wall second (1.00 = one core busy all the time):", ""]
    lines += ["| Concurrency | Path | " + " | ".join(roles) + " |", "|---:|---|" + "---:|" * len(roles)]
    for row in rows:
        for path in ("engine", "app"):
            share = row[path]["cpu_share"]
            cells = " | ".join(f"{share[r]:.2f}" if r in share else "-" for r in roles)
            lines.append(f"| {row['concurrency']} | {path} | {cells} |")
    return "\n".join(lines)


# --- the run -------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="8 requests of 32 tokens (~4 min).")
    parser.add_argument("--requests", type=int, default=None, help="Measured requests per concurrency (24).")
    parser.add_argument("--concurrency", default="1,4", help="Comma-separated concurrencies (1,4).")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="Answer budget (64).")
    parser.add_argument(
        "--model", default="", help="Model folder (default: MODEL, else the bundled SmolLM2)."
    )
    parser.add_argument("--dtype", help="Engine dtype for both paths (default: the app's DTYPE setting).")
    parser.add_argument("--request-timeout", type=float, default=300.0)
    parser.add_argument("--out", type=Path, help="Results folder (default bench/out/overhead-<timestamp>).")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    requests = args.requests or (8 if args.quick else 24)
    max_new_tokens = args.max_new_tokens or (32 if args.quick else 64)
    concurrencies = [int(c) for c in args.concurrency.split(",") if c]
    short = json.loads(PROMPTS_FILE.read_text())["short"]
    prompts = [short[i % len(short)] for i in range(requests)]
    env = {"TEMPERATURE": "0", "MAX_NEW_TOKENS": str(max_new_tokens)}
    if args.model:
        env["MODEL"] = args.model
    if args.dtype:
        env["DTYPE"] = args.dtype
    # The server inherits this process's environment; the in-process engine reads the same.
    settings = Settings.from_env({**os.environ, **env})
    machine_before = machine_info()
    print(f"[overhead] machine: {machine_before}; dtype {settings.dtype}", flush=True)
    if not settings.model:
        from services.engine.backends.local import ensure_default_model

        ensure_default_model(settings)
    out = args.out or ROOT / "bench" / "out" / f"overhead-{datetime.now():%Y%m%d-%H%M%S}"
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()

    print(f"[overhead] app path: chainlit server, {requests} requests x {concurrencies}", flush=True)
    server = AppServer(env, out / "server.log").start(timeout=900)
    try:
        app = run_until_signalled(app_path(server, prompts, concurrencies, args.request_timeout))
    finally:
        leftovers = server.stop()
    print(f"[overhead] server stopped (leftover engine processes: {len(leftovers)}); engine path", flush=True)
    try:
        direct = run_until_signalled(engine_path(settings, prompts, concurrencies, max_new_tokens))
    finally:
        reaped = reap_children()
    if reaped:
        print(f"[overhead] killed leftover child processes {reaped}", flush=True)

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(settings.model_path)

    def count_tokens(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False))

    rows = []
    for c in concurrencies:
        app_stats = phase_stats(*app[c], count_tokens)
        direct_stats = phase_stats(*direct[c], count_tokens)
        same = sum(a.text == d.text for a, d in zip(app[c][0], direct[c][0], strict=True))
        rows.append(
            {
                "concurrency": c,
                "app": app_stats,
                "engine": direct_stats,
                "comparison": compare(app_stats, direct_stats, same),
            }
        )
    table = markdown(rows)
    result = {
        "requests": requests,
        "max_new_tokens": max_new_tokens,
        "model": settings.model_path,
        "dtype": settings.dtype,
        "machine_before": machine_before,
        "machine_after": machine_info(),
        "rows": rows,
        "targets": {
            "tokens_per_s_ratio_min": TARGET_TOKENS_RATIO,
            "ttft_p50_added_ms_max": TARGET_TTFT_ADDED_MS,
        },
        "wall_seconds": round(time.monotonic() - started, 1),
    }
    (out / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "table.md").write_text(table + "\n")
    print()
    print(table)
    print(f"\n[overhead] {result['wall_seconds']:.0f} s; results in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
