"""Batching benchmark: continuous batching vs static batches of 4 (vLLM gated, and HF generate).

    .venv/bin/python bench/engine/batching.py            # full run (~15 min on a quiet 2-core machine)
    .venv/bin/python bench/engine/batching.py --quick    # smoke run (~4 min)

Three systems on the SAME model (the default SmolLM2 folder, or --model):
  continuous  every request goes into our ChatEngine the moment it arrives
              (vLLM schedules all of them together, adding and retiring
              sequences at every step);
  static-4    the same engine behind a gate: wait until 4 requests have
              arrived, submit them together, and take the next 4 only when
              the longest of them has finished; a request's answer counts as
              delivered when its batch is done (that is what static batching
              returns);
  hf-4        transformers `generate`, same gate, batch 4, left padding; run
              after the vLLM engine has shut down so they never share the cores.
Workloads: short questions, long documents, and a 70/30 mix of the two, with
Poisson arrivals (seeded) at a fixed rate per workload and a fixed number of
requests; greedy decoding and the same answer budget everywhere. Prefix caching
is off (each system would otherwise find the previous run's prompts cached).
Engine settings come from the environment like the app's (DTYPE=float32, ...).
Latency = answer delivered - request arrived; requests per minute = requests /
(last delivery - first arrival).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.common import PROMPTS_FILE, machine_info, percentile, reap_children, run_until_signalled
from services.config import Settings
from services.engine import ChatEngine, SamplingSettings, StreamStats, engine_lifespan

WORKLOADS = ("short", "long", "mix")
MIX_LONG_SHARE = 0.3
BATCH_SIZE = 4
TARGET_THROUGHPUT_RATIO = 2.5  # mixed load: continuous / static-4 requests per minute, at least
TARGET_P95_RATIO = 0.4  # mixed load: continuous / static-4 P95 latency, at most


@dataclass(frozen=True)
class Profile:
    """Sizes of one run: requests per workload, arrival rates (per minute), answer budget."""

    requests: int
    rates_per_minute: dict[str, float]
    max_new_tokens: int
    long_words_max: int  # documents longer than this are left out


FULL = Profile(
    requests=16, rates_per_minute={"short": 60, "long": 12, "mix": 24}, max_new_tokens=96, long_words_max=1500
)
QUICK = Profile(
    requests=6, rates_per_minute={"short": 60, "long": 12, "mix": 24}, max_new_tokens=32, long_words_max=900
)


@dataclass(frozen=True)
class Request:
    index: int
    kind: str  # short | long
    prompt: str
    arrival_s: float  # since the run started


@dataclass
class Result:
    index: int
    kind: str
    latency_s: float
    ttft_s: float | None
    output_tokens: int


def make_workload(name: str, profile: Profile, seed: int) -> list[Request]:
    """`profile.requests` requests with Poisson arrivals; the first arrives at 0."""
    data = json.loads(PROMPTS_FILE.read_text())
    short = list(data["short"])
    long = [doc["prompt"] for doc in data["long"] if doc["words"] <= profile.long_words_max]
    rng = random.Random(f"{name}-{seed}")
    rate_per_s = profile.rates_per_minute[name] / 60
    requests = []
    clock = 0.0
    for index in range(profile.requests):
        share = {"short": 0.0, "long": 1.0, "mix": MIX_LONG_SHARE}[name]
        kind = "long" if rng.random() < share else "short"
        prompt = rng.choice(long if kind == "long" else short)
        requests.append(Request(index, kind, prompt, clock))
        clock += rng.expovariate(rate_per_s)
    return requests


def messages(settings: Settings, prompt: str) -> list[dict[str, str]]:
    """What the app sends for a first message: its system prompt and the user's text."""
    return [{"role": "system", "content": settings.system_prompt}, {"role": "user", "content": prompt}]


async def sleep_until(deadline: float) -> None:
    await asyncio.sleep(max(0.0, deadline - time.monotonic()))


# --- vLLM: continuous and gated static ---------------------------------------------------
class VllmRunner:
    """Both vLLM systems on one engine; output token counts come from the engine's StreamStats."""

    def __init__(self, engine: ChatEngine, settings: Settings, max_new_tokens: int) -> None:
        self.engine = engine
        self.settings = settings
        self.sampling = SamplingSettings(temperature=0.0, top_p=1.0, max_new_tokens=max_new_tokens)
        self.stats: dict[str, StreamStats] = {}
        engine.on_finish(lambda stats: self.stats.__setitem__(stats.request_id, stats))
        self._runs = 0

    async def _stream(self, request: Request, request_id: str) -> tuple[float | None, float]:
        """Stream one answer to the end; (first token time, end time)."""
        first = None
        stream = self.engine.generate(messages(self.settings, request.prompt), self.sampling, request_id)
        async with contextlib.aclosing(stream):
            async for _ in stream:
                if first is None:
                    first = time.monotonic()
        return first, time.monotonic()

    async def continuous(self, requests: list[Request]) -> list[Result]:
        self._runs += 1
        start = time.monotonic()

        async def one(request: Request) -> Result:
            arrived = start + request.arrival_s
            await sleep_until(arrived)
            request_id = f"bench-c{self._runs}-{request.index}"
            first, end = await self._stream(request, request_id)
            return Result(
                request.index,
                request.kind,
                end - arrived,
                _minus(first, arrived),
                self.stats[request_id].output_tokens,
            )

        return list(await asyncio.gather(*(one(r) for r in requests)))

    async def static(self, requests: list[Request]) -> list[Result]:
        self._runs += 1
        start = time.monotonic()
        results = []
        for batch in chunks(requests, BATCH_SIZE):
            await sleep_until(start + batch[-1].arrival_s)  # the gate: wait for a full batch
            ids = [f"bench-s{self._runs}-{r.index}" for r in batch]
            streamed = await asyncio.gather(*(self._stream(r, i) for r, i in zip(batch, ids, strict=True)))
            done = time.monotonic()  # the batch is delivered when its longest answer ends
            for request, request_id, (first, _) in zip(batch, ids, streamed, strict=True):
                arrived = start + request.arrival_s
                results.append(
                    Result(
                        request.index,
                        request.kind,
                        done - arrived,
                        _minus(first, arrived),
                        self.stats[request_id].output_tokens,
                    )
                )
        return results


def _minus(value: float | None, origin: float) -> float | None:
    return None if value is None else value - origin


def chunks(items: list[Request], size: int) -> list[list[Request]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


# --- HF transformers: static batches with left padding ----------------------------------
class HfRunner:
    """transformers `generate` in batches of 4 (left padding, greedy), behind the same gate."""

    def __init__(
        self, model_dir: str, settings: Settings, max_new_tokens: int, dtype: str, threads: int
    ) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if threads:
            torch.set_num_threads(threads)
        self.torch = torch
        self.settings = settings
        self.max_new_tokens = max_new_tokens
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).eval()
        self.eos_id = self.tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.eos_id

    def _generate(self, batch: list[Request]) -> list[int]:
        """Generate for a batch; output tokens per row (up to and including the end-of-turn token)."""
        torch = self.torch
        prompts = [
            self.tokenizer.apply_chat_template(
                messages(self.settings, r.prompt), add_generation_prompt=True, tokenize=False
            )
            for r in batch
        ]
        inputs = self.tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.inference_mode():
            output = self.model.generate(
                **inputs,
                max_new_tokens=self.max_new_tokens,
                do_sample=False,
                eos_token_id=self.eos_id,
                pad_token_id=self.pad_id,
            )
        generated = output[:, inputs["input_ids"].shape[1] :]
        counts = []
        for row in generated.tolist():
            count = len(row)
            if self.eos_id in row:
                count = row.index(self.eos_id) + 1
            counts.append(count)
        return counts

    def warm_up(self) -> None:
        self._generate([Request(0, "short", "Hello", 0.0)])

    def static(self, requests: list[Request]) -> list[Result]:
        start = time.monotonic()
        results = []
        for batch in chunks(requests, BATCH_SIZE):
            time.sleep(max(0.0, start + batch[-1].arrival_s - time.monotonic()))
            counts = self._generate(batch)
            done = time.monotonic()
            for request, tokens in zip(batch, counts, strict=True):
                results.append(
                    Result(request.index, request.kind, done - start - request.arrival_s, None, tokens)
                )
        return results


# --- report ------------------------------------------------------------------------------
def run_stats(system: str, workload: str, requests: list[Request], results: list[Result]) -> dict[str, Any]:
    latencies = [r.latency_s for r in results]
    ttfts = [r.ttft_s for r in results if r.ttft_s is not None]
    by_index = {r.index: r for r in requests}
    last_delivery = max(by_index[r.index].arrival_s + r.latency_s for r in results)
    tokens = sum(r.output_tokens for r in results)
    return {
        "system": system,
        "workload": workload,
        "requests": len(results),
        "mean_latency_s": round(sum(latencies) / len(latencies), 3),
        "p95_latency_s": round(percentile(latencies, 95) or 0.0, 3),
        "p50_ttft_s": None if not ttfts else round(percentile(ttfts, 50) or 0.0, 3),
        "requests_per_minute": round(len(results) / last_delivery * 60, 2),
        "output_tokens_per_s": round(tokens / last_delivery, 1),
        "output_tokens": tokens,
        "makespan_s": round(last_delivery, 1),
    }


def ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Continuous against each static system, per workload."""
    table = {(row["workload"], row["system"]): row for row in rows}
    out = []
    for workload in WORKLOADS:
        ours = table.get((workload, "continuous"))
        for baseline in ("static-4", "hf-4"):
            other = table.get((workload, baseline))
            if ours is None or other is None:
                continue
            out.append(
                {
                    "workload": workload,
                    "baseline": baseline,
                    "throughput_ratio": round(ours["requests_per_minute"] / other["requests_per_minute"], 2),
                    "p95_ratio": round(ours["p95_latency_s"] / other["p95_latency_s"], 2),
                    "mean_latency_ratio": round(ours["mean_latency_s"] / other["mean_latency_s"], 2),
                }
            )
    return out


def markdown(rows: list[dict[str, Any]], ratio_rows: list[dict[str, Any]]) -> str:
    header = (
        "| Workload | System | Requests | Mean latency (s) | P95 latency (s) | TTFT P50 (s) | Requests/min |"
    )
    lines = [header + " Output tok/s |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        ttft = "-" if r["p50_ttft_s"] is None else f"{r['p50_ttft_s']:.2f}"
        lines.append(
            f"| {r['workload']} | {r['system']} | {r['requests']} | {r['mean_latency_s']:.2f} | "
            f"{r['p95_latency_s']:.2f} | {ttft} | {r['requests_per_minute']:.1f} | "
            f"{r['output_tokens_per_s']:.1f} |"
        )
    lines += [
        "",
        "| Workload | Continuous vs | Throughput ratio | P95 ratio | Mean latency ratio |",
        "|---|---|---:|---:|---:|",
    ]
    for r in ratio_rows:
        lines.append(
            f"| {r['workload']} | {r['baseline']} | {r['throughput_ratio']:.2f}x | {r['p95_ratio']:.2f}x | "
            f"{r['mean_latency_ratio']:.2f}x |"
        )
    return "\n".join(lines)


def verdict(ratio_rows: list[dict[str, Any]]) -> str:
    mix = next((r for r in ratio_rows if r["workload"] == "mix" and r["baseline"] == "static-4"), None)
    if mix is None:
        return "mixed-load target: not measured"
    met = mix["throughput_ratio"] >= TARGET_THROUGHPUT_RATIO and mix["p95_ratio"] <= TARGET_P95_RATIO
    return (
        f"mixed-load target (throughput >= {TARGET_THROUGHPUT_RATIO}x static-4, P95 <= {TARGET_P95_RATIO}x): "
        f"{'MET' if met else 'NOT MET'} ({mix['throughput_ratio']:.2f}x, {mix['p95_ratio']:.2f}x)"
    )


# --- the run -------------------------------------------------------------------------------
async def run_vllm(
    settings: Settings, workloads: dict[str, list[Request]], max_new_tokens: int, timeout_s: float
) -> list[dict[str, Any]]:
    rows = []
    async with engine_lifespan(settings) as engine:
        runner = VllmRunner(engine, settings, max_new_tokens)
        systems: tuple[tuple[str, Callable[[list[Request]], Awaitable[list[Result]]]], ...] = (
            ("continuous", runner.continuous),
            ("static-4", runner.static),
        )
        for name, requests in workloads.items():
            for system, run in systems:
                print(f"[batching] vLLM {system} on {name} ({len(requests)} requests)...", flush=True)
                results = await asyncio.wait_for(run(requests), timeout_s)
                rows.append(run_stats(system, name, requests, results))
                print(f"[batching]   {rows[-1]}", flush=True)
                assert engine.unfinished_requests() == 0
    return rows


def run_hf(
    settings: Settings, workloads: dict[str, list[Request]], max_new_tokens: int, dtype: str, threads: int
) -> list[dict[str, Any]]:
    runner = HfRunner(settings.model_path, settings, max_new_tokens, dtype, threads)
    runner.warm_up()
    rows = []
    for name, requests in workloads.items():
        print(f"[batching] HF static-4 on {name} ({len(requests)} requests)...", flush=True)
        rows.append(run_stats("hf-4", name, requests, runner.static(requests)))
        print(f"[batching]   {rows[-1]}", flush=True)
    return rows


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="Small sizes for a smoke run (~4 min).")
    parser.add_argument("--requests", type=int, help="Requests per workload.")
    parser.add_argument(
        "--rate",
        action="append",
        default=[],
        metavar="WORKLOAD=PER_MIN",
        help="Arrival rate per minute, e.g. --rate mix=30 (repeatable).",
    )
    parser.add_argument("--max-new-tokens", type=int, help="Answer budget of every request.")
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help="Comma-separated subset.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--model", default="", help="Model folder (default: MODEL, else the bundled SmolLM2)."
    )
    parser.add_argument("--skip-hf", action="store_true", help="Leave out the transformers baseline.")
    parser.add_argument("--dtype", help="vLLM dtype (default: the app's DTYPE setting).")
    parser.add_argument(
        "--hf-dtype", help="torch dtype of the HF baseline (default: vLLM's, auto = float32)."
    )
    parser.add_argument("--hf-threads", type=int, default=0, help="torch threads of the HF baseline (all).")
    parser.add_argument("--prefix-caching", action="store_true", help="Keep vLLM prefix caching on.")
    parser.add_argument("--max-num-batched-tokens", type=int, help="Engine step budget (default: the app's).")
    parser.add_argument(
        "--run-timeout", type=float, default=1200.0, help="Seconds one system/workload may take."
    )
    parser.add_argument("--out", type=Path, help="Results folder (default bench/out/batching-<timestamp>).")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    base = QUICK if args.quick else FULL
    rates = dict(base.rates_per_minute)
    for item in args.rate:
        name, _, value = item.partition("=")
        if name not in WORKLOADS:
            raise SystemExit(f"--rate {item}: workload must be one of {WORKLOADS}")
        rates[name] = float(value)
    profile = Profile(
        args.requests or base.requests, rates, args.max_new_tokens or base.max_new_tokens, base.long_words_max
    )
    # The app's settings from the environment (DTYPE, MAX_NUM_BATCHED_TOKENS, ... apply), then the flags.
    settings = Settings.from_env().replace(enable_prefix_caching=args.prefix_caching)
    if args.model:
        settings = settings.replace(model=args.model)
    if args.dtype:
        settings = settings.replace(dtype=args.dtype)
    if args.max_num_batched_tokens:
        settings = settings.replace(max_num_batched_tokens=args.max_num_batched_tokens)
    hf_dtype = args.hf_dtype or (settings.dtype if settings.dtype in ("bfloat16", "float16") else "float32")
    machine_before = machine_info()
    print(f"[batching] machine: {machine_before}; dtype {settings.dtype}", flush=True)
    if not settings.model:
        from services.engine.backends.local import ensure_default_model

        ensure_default_model(settings)
    names = [name for name in args.workloads.split(",") if name]
    workloads = {name: make_workload(name, profile, args.seed) for name in names}
    out = args.out or ROOT / "bench" / "out" / f"batching-{datetime.now():%Y%m%d-%H%M%S}"
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()

    try:
        rows = run_until_signalled(run_vllm(settings, workloads, profile.max_new_tokens, args.run_timeout))
    finally:
        reaped = reap_children()
    if reaped:
        print(f"[batching] killed leftover child processes {reaped}", flush=True)
    if not args.skip_hf:  # only now: the vLLM engine is shut down and the cores are free
        rows += run_hf(settings, workloads, profile.max_new_tokens, hf_dtype, args.hf_threads)
    order = {"continuous": 0, "static-4": 1, "hf-4": 2}
    rows.sort(key=lambda r: (WORKLOADS.index(r["workload"]), order[r["system"]]))
    ratio_rows = ratios(rows)
    table = markdown(rows, ratio_rows)
    result = {
        "profile": asdict(profile),
        "seed": args.seed,
        "model": settings.model_path,
        "prefix_caching": args.prefix_caching,
        "max_num_batched_tokens": settings.max_num_batched_tokens,
        "dtype": settings.dtype,
        "hf_dtype": None if args.skip_hf else hf_dtype,
        "hf_threads": args.hf_threads or "all cores",
        "machine_before": machine_before,
        "machine_after": machine_info(),
        "rows": rows,
        "ratios": ratio_rows,
        "verdict": verdict(ratio_rows),
        "wall_seconds": round(time.monotonic() - started, 1),
    }
    (out / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "table.md").write_text(table + "\n\n" + result["verdict"] + "\n")
    print()
    print(table)
    print()
    print(result["verdict"])
    print(f"[batching] {result['wall_seconds']:.0f} s; results in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
