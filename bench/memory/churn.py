"""Accelerated churn: many short requests straight into the engine; the bytes each process keeps per request.

    .venv/bin/python bench/memory/churn.py --tiny --requests 3000              # quick, tiny model
    .venv/bin/python bench/memory/churn.py --requests 20000                    # default model
    .venv/bin/python bench/memory/churn.py --tiny --requests 20000 \\
        --allocators glibc,tcmalloc,jemalloc,glibc-arena2               # allocators side by side
    .venv/bin/python bench/memory/churn.py --tiny --requests 6000 --attribute  # who keeps it: probe snapshots
    .venv/bin/python bench/memory/churn.py --requests 20000 --arm-seconds 600 \\
        --allocators glibc,tcmalloc,jemalloc,glibc-arena2               # each arm bounded in time too
    .venv/bin/python bench/memory/churn.py --requests 1200 --sample-every 300 --concurrency 4,32 \\
        --allocators configured,onednn-vllm,configured --probe counters # our primitive cap vs vLLM's

No app and no network: `ChatEngine` over vLLM's AsyncLLM in this process,
`--concurrency` requests in flight, as fast as the machine serves them (a
list, e.g. `4,4,4,32`, is cycled block by block: bursts of new batch sizes). Each
request has its own prompt length (a shared system prompt plus 1 to
`--max-prompt-words` random words) and answer budget (1 to
`--max-answer-tokens`), and `--abort-fraction` of them are dropped after 1-3
deltas (the consumer stops reading: ChatEngine aborts them in the engine).

`--conversations N` shapes the requests like the app's traffic instead: they
are the turns of N interleaved conversations of `--turns` turns. A first turn
summarizes a document (up to `--max-prompt-words` words) as the app does
(summary rules, minimum length, the documents' priority); later turns ask a
short follow-up over the whole history (prefix-cache hits) with the chat
penalties, first in the queue.

Every `--sample-every` requests the load pauses until the engine holds no
request, and the RSS and anonymous memory of every process in the tree (this
process = "app", vLLM's EngineCore and worker, helpers) are recorded. The
bytes kept per request are the Theil-Sen slope of memory against requests
served, after `--warmup` requests, with Sen's 95% interval. Arms
(`--allocators`) run one after the other in one invocation, each on a fresh
engine, never two engines at once. `--arm-seconds` bounds each arm's load
in time: it stops at the first memory sample after that (the report gives
the requests it served). The summary is rewritten after every arm, so a run
cut short keeps the arms it finished. Exit code 1 when a process keeps more than
`--max-bytes-per-request` (anonymous memory) in any arm.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import gc
import json
import os
import random
import signal
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any
from unittest import mock

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import numpy as np

from bench.common import PROMPTS_FILE, machine_info, run_until_signalled
from services.admission.tickets import CHAT, DOCUMENT, engine_priority, queue_key
from services.chat.store import session_sampling
from services.config import Settings
from services.engine import ChatEngine, RepetitionError, SamplingSettings, StreamStats, engine_lifespan
from services.engine.backends.local import engine as local_engine
from services.engine.backends.local import engine_processes
from services.memory import engine_memory_env
from services.observability.app_probe import mapping_categories
from services.observability.attribution import attribute
from services.observability.memory import process_tree_memory
from services.observability.series import theil_sen_interval

TINY_MAX_MODEL_LEN = 4096  # as in tests/conftest.py
DEFAULT_MODEL_POOL_TOKENS = 46_592  # the default model's KV pool in 1 GiB (bfloat16) here, per vLLM's log
# Arms of a side-by-side run: settings changes over the configured defaults.
ARMS: dict[str, dict[str, Any]] = {
    "glibc": {"engine_allocator": "glibc", "engine_malloc_arena_max": 0},
    "glibc-arena2": {"engine_allocator": "glibc", "engine_malloc_arena_max": 2},
    "tcmalloc": {"engine_allocator": "tcmalloc"},
    "jemalloc": {"engine_allocator": "jemalloc"},
    "onednn-vllm": {},  # the settings as configured; ENGINE_CONSTANT_ARMS changes the engine
}
# Arms that change constants of the in-process engine (services/engine/backends/local/engine.py).
ENGINE_CONSTANT_ARMS: dict[str, dict[str, Any]] = {
    "onednn-vllm": {"ENGINE_ONEDNN_MM_CACHE": 0},  # vLLM's own 32 primitives per weight
}
JEMALLOC_PROFILING = "prof:true,prof_active:true,lg_prof_sample:16"
ENGINE_ROLES = ("EngineCore", "Worker")
PROBE_WAIT_SECONDS = 300.0
IDLE_WAIT_SECONDS = 60.0
MAX_SETTLE_SECONDS = 15.0


@dataclass
class ChurnOptions:
    """One churn run (all arms)."""

    requests: int = 3000
    sample_every: int = 1000
    warmup: int | None = None  # default: two sample intervals
    concurrency: list[int] = field(default_factory=lambda: [24])  # per block, cycled: bursts
    abort_fraction: float = 0.2
    max_prompt_words: int = 60
    max_answer_tokens: int = 32
    seed: int = 0
    tiny: bool = False
    allocators: list[str] = field(default_factory=lambda: ["configured"])
    probe: str = ""  # the engine's memory probe: "" off, counters, native (+ jemalloc profiles), all
    max_bytes_per_request: float | None = None
    arm_seconds: float | None = None  # each arm stops at the first sample after this much load
    conversations: int = 0  # 0: independent requests; N: turns of N interleaved conversations
    turns: int = 4
    out: Path | None = None

    @property
    def warmup_requests(self) -> int:
        return self.warmup if self.warmup is not None else 2 * self.sample_every


@dataclass(frozen=True)
class Plan:
    """One request of the churn: its prompt, answer budget, and when its reader walks away."""

    messages: list[dict[str, str]]
    sampling: SamplingSettings
    abort_after_deltas: int | None
    prose: bool = False  # summary rules: the loop guard's paraphrase check, the "---" stop
    priority: int = 0


FOLLOW_UP_WORDS = 30
SUMMARY_MIN_TOKENS = 8


class Workload:
    """Deterministic requests: index -> Plan, from a seed and the prompt file's words."""

    def __init__(self, options: ChurnOptions, settings: Settings) -> None:
        """Chat turns and summaries sample and queue as the app's do under `settings`."""
        self.options = options
        self.settings = settings
        self.system_prompt = settings.system_prompt
        self.chat = session_sampling(settings)
        self.epoch = time.monotonic()
        prompts = json.loads(PROMPTS_FILE.read_text())
        text = " ".join([*prompts["short"], *(doc["prompt"] for doc in prompts["long"])])
        self.words = sorted(set(text.split()))

    def plan(self, index: int) -> Plan:
        rng = random.Random(self.options.seed * 1_000_003 + index)
        abort_after = rng.randint(1, 3) if rng.random() < self.options.abort_fraction else None
        max_new_tokens = rng.randint(1, self.options.max_answer_tokens)
        if self.options.conversations:
            return self._turn(index, max_new_tokens, abort_after)
        words = rng.choices(self.words, k=rng.randint(1, self.options.max_prompt_words))
        messages = [
            {"role": "system", "content": self.system_prompt},
            {"role": "user", "content": " ".join(words)},
        ]
        sampling = SamplingSettings(temperature=0.8, top_p=0.95, max_new_tokens=max_new_tokens)
        return Plan(messages, sampling, abort_after)

    def conversation_turn(self, index: int) -> tuple[int, int]:
        """(conversation, turn) of request `index`: conversations interleave, so a follow-up comes
        `conversations` requests after its previous turn, whose prompt is in the prefix cache by then."""
        conversations = self.options.conversations
        turns = max(1, self.options.turns)
        conversation = index % conversations + conversations * (index // (conversations * turns))
        return conversation, (index // conversations) % turns

    def _turn(self, index: int, max_new_tokens: int, abort_after: int | None) -> Plan:
        """A turn as the app sends it; its priority is its arrival second, a document's aged as
        services/admission ages it (vLLM sees a new priority value every second)."""
        conversation, turn = self.conversation_turn(index)
        arrival = time.monotonic() - self.epoch
        rng = random.Random(self.options.seed * 1_000_003 + 7_919 * conversation + 1)
        document = rng.choices(self.words, k=rng.randint(1, self.options.max_prompt_words))
        messages = [
            {"role": "system", "content": self.system_prompt},
            {"role": "user", "content": "Summarize this document:\n\n" + " ".join(document)},
        ]
        for _ in range(turn):  # the history: earlier answers and questions, the same on every turn
            answer = rng.choices(self.words, k=rng.randint(1, self.options.max_answer_tokens))
            question = rng.choices(self.words, k=rng.randint(1, FOLLOW_UP_WORDS))
            messages += [
                {"role": "assistant", "content": " ".join(answer)},
                {"role": "user", "content": " ".join(question)},
            ]
        if turn == 0:
            minimum = min(SUMMARY_MIN_TOKENS, max_new_tokens)
            sampling = dataclasses.replace(self.chat, max_new_tokens=max_new_tokens, min_new_tokens=minimum)
            return Plan(
                messages, sampling, abort_after, prose=True, priority=self._priority(DOCUMENT, arrival)
            )
        sampling = dataclasses.replace(self.chat, max_new_tokens=max_new_tokens)
        return Plan(messages, sampling, abort_after, priority=self._priority(CHAT, arrival))

    def _priority(self, kind: str, arrival: float) -> int:
        return engine_priority(self.settings, queue_key(self.settings, kind, arrival))


class Tally:
    """What the finished requests produced (the engine's on_finish listener): counts only, no lists."""

    def __init__(self) -> None:
        self.requests = self.aborted = self.output_tokens = self.prompt_tokens = 0

    def record(self, stats: StreamStats) -> None:
        self.requests += 1
        self.aborted += stats.finish_reason == "abort"
        self.output_tokens += stats.output_tokens
        self.prompt_tokens += stats.prompt_tokens


async def one_request(engine: ChatEngine, plan: Plan, request_id: str) -> None:
    """Stream one answer; stop reading after `abort_after_deltas` deltas when the plan says so.

    The loop guard may end it too (random words make a real model loop); it aborts the request in
    the engine, one more way a request ends.
    """
    stream = engine.generate(
        plan.messages, plan.sampling, request_id, priority=plan.priority, prose=plan.prose
    )
    deltas = 0
    async with contextlib.aclosing(stream):
        with contextlib.suppress(RepetitionError):
            async for _ in stream:
                deltas += 1
                if plan.abort_after_deltas is not None and deltas >= plan.abort_after_deltas:
                    break


async def run_block(
    engine: ChatEngine, workload: Workload, first: int, last: int, concurrency: int, tag: str
) -> None:
    """Requests first..last-1 with `concurrency` in flight; returns when all have ended."""
    pending = iter(range(first, last))

    async def worker() -> None:
        for index in pending:
            await one_request(engine, workload.plan(index), f"{tag}-{index}")

    await asyncio.gather(*(worker() for _ in range(concurrency)))


def settle_seconds(memory_env: dict[str, str]) -> float:
    """How long to wait after the last request before a sample: the worker's last step, plus
    jemalloc's decay time, after which it has handed back the pages a burst dirtied.

    Sampled sooner, a process holds up to a few MB it is about to purge; over
    a few thousand requests that noise reads as a kilobyte per request.
    """
    options = dict(item.partition(":")[::2] for item in memory_env.get("MALLOC_CONF", "").split(","))
    decays = [
        int(value) / 1000
        for key in ("dirty_decay_ms", "muzzy_decay_ms")
        if (value := options.get(key, "")).isdigit()  # -1 (never decay) is not a wait
    ]
    return 0.5 + min(max(decays, default=0.0), MAX_SETTLE_SECONDS)


async def wait_until_idle(engine: ChatEngine, settle: float = 0.5) -> None:
    deadline = time.monotonic() + IDLE_WAIT_SECONDS
    while engine.unfinished_requests() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    await asyncio.sleep(settle)


def memory_row(requests: int, seconds: float) -> dict[str, Any]:
    """RSS and anonymous memory (+swap) of every process in this tree, keyed by role."""
    processes = process_tree_memory()
    return {
        "requests": requests,
        "seconds": round(seconds, 2),
        "processes": {p.role: {"rss": p.rss, "anon": p.anon_swap, "pid": p.pid} for p in processes},
        "mappings": {
            p.role: mapping_categories(p.pid) for p in processes if p.role.startswith(("app", *ENGINE_ROLES))
        },
    }


async def probe_snapshots(probe_dir: Path, label: str) -> int:
    """Ask EngineCore and the worker for a snapshot labelled `label`; wait until each has written it."""
    (probe_dir / "label").write_text(label)
    processes = engine_processes()
    for process in processes:
        with contextlib.suppress(OSError):
            os.kill(process.pid, signal.SIGUSR2)
    deadline = time.monotonic() + PROBE_WAIT_SECONDS
    while time.monotonic() < deadline:
        written = {p.name.split("-")[1] for p in probe_dir.glob(f"*-{label}.census")}
        if all(str(p.pid) in written for p in processes):
            return len(written)
        await asyncio.sleep(0.25)
    print(f"[churn] probe snapshot {label}: not all engine processes answered", flush=True)
    return 0


def retention(rows: list[dict[str, Any]], warmup: int) -> dict[str, Any]:
    """Per role and for the whole tree: bytes kept per request (Theil-Sen, Sen's 95% interval)."""
    measured = [row for row in rows if row["requests"] >= warmup]
    roles = sorted({role for row in measured for role in row["processes"]})
    result: dict[str, Any] = {}
    for role in [*roles, "tree"]:
        points = [(row["requests"], _value(row, role)) for row in measured]
        points = [(n, v) for n, v in points if v is not None]
        if len(points) < 3:
            continue
        xs = np.array([n for n, _ in points], dtype=float)
        entry: dict[str, Any] = {"samples": len(points)}
        for kind in ("anon", "rss"):
            ys = np.array([v[kind] for _, v in points], dtype=float)
            slope, low, high = theil_sen_interval(xs, ys)
            entry[f"{kind}_bytes_per_request"] = round(slope, 1)
            entry[f"{kind}_bytes_per_request_95"] = [round(low, 1), round(high, 1)]
            entry[f"{kind}_mb_first_last"] = [round(ys[0] / 2**20, 1), round(ys[-1] / 2**20, 1)]
        result[role] = entry
    return result


def mapping_growth(rows: list[dict[str, Any]], warmup: int) -> dict[str, dict[str, float]]:
    """Per process and kind of mapping (heap, JIT code, arenas...): anonymous bytes kept per request."""
    measured = [row for row in rows if row["requests"] >= warmup]
    growth: dict[str, dict[str, float]] = {}
    for role in sorted({role for row in measured for role in row.get("mappings", {})}):
        kinds = sorted({kind for row in measured for kind in row["mappings"].get(role, {})})
        for kind in kinds:
            xs = np.array([row["requests"] for row in measured], dtype=float)
            ys = np.array([row["mappings"].get(role, {}).get(kind, 0) for row in measured], dtype=float)
            if len(xs) >= 3:
                growth.setdefault(role, {})[kind] = round(theil_sen_interval(xs, ys)[0], 1)
    return growth


def _value(row: dict[str, Any], role: str) -> dict[str, int] | None:
    processes = row["processes"]
    if role == "tree":
        return {kind: sum(p[kind] for p in processes.values()) for kind in ("anon", "rss")}
    return processes.get(role)


def arm_settings(base: Settings, arm: str, probe_dir: Path | None, probe: str = "all") -> Settings:
    """The arm's engine settings; with a probe folder, the memory probe on: counters and a census at
    every sample, plus jemalloc's heap profiles (`native`) and tracemalloc (`all`)."""
    settings = base if arm == "configured" else base.replace(**ARMS[arm])
    if probe_dir is not None:
        # counters and native: no tracemalloc (DIAGNOSTICS=counters); all: tracemalloc too (memory).
        level = "memory" if probe == "all" else "counters"
        settings = settings.replace(diagnostics=level, diagnostics_dir=str(probe_dir))
        if probe != "counters" and settings.engine_allocator == "jemalloc":
            conf = f"{settings.engine_jemalloc_conf},{JEMALLOC_PROFILING},prof_prefix:{probe_dir}/jeprof"
            settings = settings.replace(engine_jemalloc_conf=conf.strip(","))
    return settings


@contextlib.asynccontextmanager
async def arm_engine(settings: Settings, arm: str) -> AsyncIterator[ChatEngine]:
    """The engine of one arm: its settings, and the engine constants the arm changes."""
    constants = ENGINE_CONSTANT_ARMS.get(arm, {})
    with mock.patch.multiple(local_engine, **constants) if constants else contextlib.nullcontext():
        async with engine_lifespan(settings) as engine:
            yield engine


async def run_arm(base: Settings, arm: str, options: ChurnOptions, out: Path) -> dict[str, Any]:
    """One engine, `options.requests` requests, a memory row every `sample_every`."""
    probe_dir = out / f"probe-{arm}" if options.probe else None
    settings = arm_settings(base, arm, probe_dir, options.probe)
    memory_env = engine_memory_env(settings, {})
    settle = settle_seconds(memory_env)
    described = memory_env or "glibc defaults"
    print(f"[churn] arm {arm}: {described}; samples {settle:.1f} s after idle", flush=True)
    tally = Tally()
    rows = []
    busy_seconds = 0.0
    workload = Workload(options, settings)
    async with arm_engine(settings, arm) as engine:
        engine.on_finish(tally.record)
        await wait_until_idle(engine, settle)
        rows.append(memory_row(0, 0.0))
        if probe_dir is not None:
            await probe_snapshots(probe_dir, "r000000")
        for first in range(0, options.requests, options.sample_every):
            last = min(first + options.sample_every, options.requests)
            started = time.monotonic()
            in_flight = options.concurrency[first // options.sample_every % len(options.concurrency)]
            await run_block(engine, workload, first, last, in_flight, arm)
            busy_seconds += time.monotonic() - started
            await wait_until_idle(engine, settle)
            gc.collect()
            rows.append({**memory_row(last, busy_seconds), "concurrency": in_flight})
            if probe_dir is not None:
                await probe_snapshots(probe_dir, f"r{last:06d}")
            print(f"[churn] {arm}: {last} requests, {_progress(rows[-1], busy_seconds, tally)}", flush=True)
            if options.arm_seconds is not None and busy_seconds >= options.arm_seconds:
                print(f"[churn] {arm}: time budget of {options.arm_seconds:.0f} s spent", flush=True)
                break
        unfinished = engine.unfinished_requests()
    return arm_report(arm, settings, options, rows, tally, busy_seconds, unfinished, probe_dir)


def arm_report(
    arm: str,
    settings: Settings,
    options: ChurnOptions,
    rows: list[dict[str, Any]],
    tally: Tally,
    busy_seconds: float,
    unfinished: int,
    probe_dir: Path | None,
) -> dict[str, Any]:
    kept = retention(rows, options.warmup_requests)
    processes = {role: entry for role, entry in kept.items() if role != "tree"}
    worst = max(processes, key=lambda role: processes[role]["anon_bytes_per_request"], default=None)
    report = {
        "arm": arm,
        "engine_env": engine_memory_env(settings),
        "requests": tally.requests,
        "aborted": tally.aborted,
        "busy_seconds": round(busy_seconds, 1),
        "requests_per_second": round(tally.requests / busy_seconds, 2) if busy_seconds else None,
        "output_tokens_per_second": round(tally.output_tokens / busy_seconds, 1) if busy_seconds else None,
        "prompt_tokens_per_second": round(tally.prompt_tokens / busy_seconds, 1) if busy_seconds else None,
        "unfinished_after": unfinished,
        "retention": kept,
        "retention_by_mapping": mapping_growth(rows, options.warmup_requests),
        "worst_process": worst,
        "worst_anon_bytes_per_request": processes[worst]["anon_bytes_per_request"] if worst else None,
        "samples": rows,
    }
    if probe_dir is not None and options.probe != "counters":
        print(f"[churn] {arm}: attributing growth (jeprof can take minutes)", flush=True)
        report["attribution"] = attribute(probe_dir, since=f"r{options.warmup_requests:06d}")
    if options.max_bytes_per_request is not None:
        report["passed"] = bool(
            worst is None or report["worst_anon_bytes_per_request"] <= options.max_bytes_per_request
        )
    return report


def _progress(row: dict[str, Any], seconds: float, tally: Tally) -> str:
    memory = ", ".join(f"{role} {p['anon'] / 2**20:.1f}" for role, p in row["processes"].items())
    return (
        f"{tally.requests / seconds:.1f} req/s, {tally.output_tokens / seconds:.0f} tok/s; anon MB: {memory}"
    )


async def run(options: ChurnOptions, base: Settings | None = None) -> dict[str, Any]:
    """Every arm in turn on `base` (default: the settings from the environment); the summary."""
    out = options.out or ROOT / "bench" / "out" / f"churn-{datetime.now():%Y%m%d-%H%M%S}"
    out.mkdir(parents=True, exist_ok=True)
    base = base or Settings.from_env()
    if options.tiny:
        base = base.replace(**tiny_model_settings(base))
    options_dict = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(options).items()}
    summary: dict[str, Any] = {
        "started_at": datetime.now().isoformat(timespec="seconds"),
        "options": options_dict,
        "model": base.model_path,
        "machine_before": machine_info(),
        "arms": [],
    }
    for arm in options.allocators:  # the summary after each arm: a run cut short keeps what it finished
        summary["arms"].append(await run_arm(base, arm, options, out))
        summary["machine_after"] = machine_info()
        if options.max_bytes_per_request is not None:
            summary["passed"] = all(arm["passed"] for arm in summary["arms"])
        (out / "churn-summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        print(f"[churn] wrote {out / 'churn-summary.json'}", flush=True)
    return summary


def tiny_model_settings(base: Settings) -> dict[str, Any]:
    from harness.tiny_model import build_tiny_model
    from services.engine.backends.local import ensure_default_model

    default_dir = ensure_default_model(Settings.from_env({}))
    tiny_dir = build_tiny_model(default_dir, Path(base.cache_dir) / "models" / "tiny-llama")
    return {
        "model": str(tiny_dir),
        "max_model_len": TINY_MAX_MODEL_LEN,
        "max_num_batched_tokens": TINY_MAX_MODEL_LEN,
        "num_gpu_blocks_override": default_model_pool_blocks(base),
    }


def default_model_pool_blocks(settings: Settings) -> int:
    """KV blocks of the default model's pool, for the tiny model (whose 1 GiB holds 2M tokens).

    vLLM's prefix cache keeps a hash for every block it ever filled, so a pool 45x larger
    grows ~240 B per request for ~20,000 requests before it is full (BENCHMARKS.md, churn).
    """
    return settings.num_gpu_blocks_override or DEFAULT_MODEL_POOL_TOKENS // (settings.block_size or 16)


def report_table(summary: dict[str, Any]) -> str:
    """Markdown: bytes kept per request per process and throughput, one row per arm."""
    roles = sorted({role for arm in summary["arms"] for role in arm["retention"] if role != "tree"})
    head = ["arm", "req/s", "output tok/s", *[f"{r} B/req" for r in roles], "tree B/req"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for arm in summary["arms"]:
        cells = [arm["arm"], f"{arm['requests_per_second']}", f"{arm['output_tokens_per_second']}"]
        for role in [*roles, "tree"]:
            entry = arm["retention"].get(role)
            if entry is None:
                cells.append("–")
            else:
                low, high = entry["anon_bytes_per_request_95"]
                cells.append(f"{entry['anon_bytes_per_request']:.0f} [{low:.0f}, {high:.0f}]")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> ChurnOptions:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--requests", type=int, default=3000, help="requests per arm (>= 20000 for a verdict)"
    )
    parser.add_argument("--sample-every", type=int, default=1000, help="requests between memory samples")
    parser.add_argument("--warmup", type=int, default=None, help="requests left out of the slope (2 samples)")
    parser.add_argument(
        "--concurrency", default="24", help="requests in flight; a list (4,4,32) is cycled block by block"
    )
    parser.add_argument("--abort-fraction", type=float, default=0.2, help="requests dropped mid-stream")
    parser.add_argument("--max-prompt-words", type=int, default=60)
    parser.add_argument("--max-answer-tokens", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tiny", action="store_true", help="the tiny random test model")
    parser.add_argument(
        "--allocators", default="configured", help=f"comma-separated arms: configured, {', '.join(ARMS)}"
    )
    parser.add_argument(
        "--probe",
        choices=("counters", "native", "all"),
        default="",
        help="memory probe in the engine at every sample: allocator counters and an object census; "
        "native: + jemalloc heap profiles, attributed; all: + tracemalloc (slow)",
    )
    parser.add_argument("--attribute", dest="probe", action="store_const", const="all", help="= --probe all")
    parser.add_argument(
        "--max-bytes-per-request", type=float, default=None, help="fail above this (anon, any process)"
    )
    parser.add_argument(
        "--arm-seconds", type=float, default=None, help="stop each arm at the next sample after this"
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="report folder (default bench/out/churn-<time>)"
    )
    parser.add_argument(
        "--conversations", type=int, default=0, help="app-like: turns of this many interleaved conversations"
    )
    parser.add_argument("--turns", type=int, default=4, help="turns per conversation (with --conversations)")
    args = parser.parse_args(argv)
    arms = [name.strip() for name in args.allocators.split(",") if name.strip()]
    unknown = [name for name in arms if name != "configured" and name not in ARMS]
    if unknown:
        parser.error(f"unknown arm(s) {unknown}; choose from configured, {', '.join(ARMS)}")
    return ChurnOptions(
        requests=args.requests,
        sample_every=args.sample_every,
        warmup=args.warmup,
        concurrency=[int(n) for n in args.concurrency.split(",")],
        abort_fraction=args.abort_fraction,
        max_prompt_words=args.max_prompt_words,
        max_answer_tokens=args.max_answer_tokens,
        seed=args.seed,
        tiny=args.tiny,
        allocators=arms,
        probe=args.probe,
        max_bytes_per_request=args.max_bytes_per_request,
        arm_seconds=args.arm_seconds,
        out=args.out,
        conversations=args.conversations,
        turns=args.turns,
    )


def main(argv: list[str] | None = None) -> int:
    options = parse_args(argv)
    summary = run_until_signalled(run(options))
    print(report_table(summary))
    for arm in summary["arms"]:
        if "attribution" in arm:
            print(f"\nattribution, arm {arm['arm']}:\n{json.dumps(arm['attribution'], indent=1)[:6000]}")
    return 0 if summary.get("passed", True) else 1


if __name__ == "__main__":
    sys.exit(main())
