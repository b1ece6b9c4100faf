"""API overhead: vLLM's own serving benchmark against the app's /v1 API and a plain vLLM server.

    .venv/bin/python bench/overhead/api_layer.py --quick            # validation (~6 min on 2 cores)
    .venv/bin/python bench/overhead/api_layer.py --save-results     # verdict (~20 min) into bench/results/

One run, phases in turn (never two engines at once), on the same model and engine options:
  plain: `python -m vllm.entrypoints.openai.api_server` (harness.server.VllmServer), the reference,
         started with the engine environment the app gives vLLM's processes (ENGINE_ALLOCATOR's
         preload and MALLOC_CONF, the oneDNN cache bound, priority scheduling, the prefill cap), so
         the ratio judges the API layer and not the allocator (which the churn bench judges);
  plain-vllm-defaults: the same server on vLLM's own defaults (glibc, fcfs), first round only:
         what the engine environment itself costs (informational);
  app:   `chainlit run app.py` (harness.server.AppServer), an account and key made with
         `python -m services.accounts`, requests through the gate and vLLM's layer mounted in the app.
Each phase runs `vllm.benchmarks.serve` (vLLM's serving benchmark, called as a module: the `vllm`
command of the CPU package fails on its own metadata) twice with the same random prompts (fixed
seed), ignore_eos, after warm-up requests: `load` at --concurrency (throughput), and `single`, one
request at a time (16 tokens out), whose TTFT is the request path's own cost plus one prefill: at
concurrency 8 the TTFT median moved by 700 ms between two runs of the same plain server, so it cannot
judge 15 ms. `--rounds N` alternates plain/app N times, so drift on the machine lands on both. Prints
throughput, TTFT and TPOT percentiles per phase and the ratios: app/plain output throughput of
`load` (target >= 0.95) and app - plain TTFT P50 of `single` (target <= 15 ms; the `load`
difference is reported beside it).

The app arms differ in policy, not in code path (every request passes the gate, the key check, the
admission call and vLLM's layer):
  app           capacity admission and per-user limits off, like the plain server: the cost of the
                layer itself, which the targets judge;
  app-admitted  the defaults, except per-user limits (the benchmark is one client with one key, which
                USER_MAX_CONCURRENT_TURNS would refuse by design): what admission at a reading pace
                does to a program that sends --concurrency requests at once (first --admitted-rounds
                rounds only; informational).
A plain or app phase that did not complete every prompt fails the run instead of giving a ratio
(app-admitted may refuse requests over the reading pace by design: its count is reported).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.common import machine_info, result_path
from harness.server import AppServer, VllmServer
from services.config import Settings
from services.engine.backends.local import ensure_default_model, worker_thread_env
from services.engine.backends.local.engine import ENGINE_ONEDNN_CACHE_CAPACITY
from services.memory import engine_memory_env

TARGET_THROUGHPUT_RATIO = 0.95
TARGET_TTFT_ADDED_MS = 15.0
KEPT = (
    "completed",
    "request_throughput",
    "output_throughput",
    "total_token_throughput",
    "mean_ttft_ms",
    "median_ttft_ms",
    "p99_ttft_ms",
    "mean_tpot_ms",
    "median_tpot_ms",
    "p99_tpot_ms",
    "median_itl_ms",
    "median_e2el_ms",
)


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="model folder (default: the prepared default model)")
    parser.add_argument("--quick", action="store_true", help="a short validation run")
    parser.add_argument("--rounds", type=int, default=1, help="plain/app alternations")
    parser.add_argument("--admitted-rounds", type=int, default=1, help="rounds that also run app-admitted")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--input-len", type=int, default=256)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--single-prompts", type=int, default=24, help="prompts of the one-at-a-time run")
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument(
        "--endpoint", default="/v1/completions", choices=["/v1/completions", "/v1/chat/completions"]
    )
    parser.add_argument(
        "--save-results", action="store_true", help="write the JSON summary to bench/results/overhead/"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "api-overhead")
    arguments = parser.parse_args()
    if arguments.quick:
        arguments.prompts = 16
        arguments.output_len = 32
        arguments.single_prompts = 8
    return arguments


@dataclass(frozen=True)
class Load:
    """One run of the serving benchmark: how many prompts, how many at once, their lengths."""

    prompts: int
    concurrency: int
    input_len: int
    output_len: int


def loads(arguments: argparse.Namespace) -> dict[str, Load]:
    """`load`: the throughput run; `single`: one request at a time, so TTFT is the request path's own
    cost plus one prefill (at concurrency 8 the median TTFT moved 700 ms between two plain runs)."""
    return {
        "load": Load(arguments.prompts, arguments.concurrency, arguments.input_len, arguments.output_len),
        "single": Load(arguments.single_prompts, 1, arguments.input_len, 16),
    }


def run_serving_benchmark(
    base_url: str,
    model: str,
    tokenizer: str,
    arguments: argparse.Namespace,
    load: Load,
    key: str | None,
    result_file: Path,
) -> dict[str, Any]:
    """`python -m vllm.benchmarks.serve`-equivalent: vLLM's benchmark module, in a child process."""
    backend = "openai-chat" if arguments.endpoint.endswith("chat/completions") else "openai"
    code = (
        "import sys\nfrom vllm.benchmarks.serve import add_cli_args, main\n"
        "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
        "parser = FlexibleArgumentParser()\nadd_cli_args(parser)\nmain(parser.parse_args(sys.argv[1:]))\n"
    )
    command = [
        sys.executable,
        "-c",
        code,
        "--backend",
        backend,
        "--base-url",
        base_url,
        "--endpoint",
        arguments.endpoint,
        "--model",
        model,
        "--tokenizer",
        tokenizer,
        "--dataset-name",
        "random",
        "--seed",
        "0",
        "--random-input-len",
        str(load.input_len),
        "--random-output-len",
        str(load.output_len),
        "--num-prompts",
        str(load.prompts),
        "--max-concurrency",
        str(load.concurrency),
        "--num-warmups",
        str(min(4, load.concurrency)),
        "--ignore-eos",
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
        "--metric-percentiles",
        "50,90,99",
        "--save-result",
        "--result-dir",
        str(result_file.parent),
        "--result-filename",
        result_file.name,
    ]
    env = {**os.environ, "OPENAI_API_KEY": key or "", "VLLM_NO_USAGE_STATS": "1"}
    subprocess.run(command, env=env, check=True, timeout=3600)
    result = json.loads(result_file.read_text())
    return {name: result.get(name) for name in KEPT}


def run_phase(
    base_url: str,
    model: str,
    tokenizer: str,
    arguments: argparse.Namespace,
    runs: dict[str, Load],
    key: str | None,
    stem: str,
) -> dict[str, dict[str, Any]]:
    """Each of `runs` against one server, in turn; results by run name (files `<stem>-<name>.json`)."""
    return {
        name: run_serving_benchmark(
            base_url, model, tokenizer, arguments, load, key, arguments.out / f"{stem}-{name}.json"
        )
        for name, load in runs.items()
    }


def app_engine_options(settings: Settings) -> tuple[dict[str, str], list[str]]:
    """(environment, server flags): what the app gives vLLM's processes beyond the shared options."""
    env = {
        **engine_memory_env(settings, {}),
        "ONEDNN_PRIMITIVE_CACHE_CAPACITY": str(ENGINE_ONEDNN_CACHE_CAPACITY),
    }
    if "VLLM_CPU_OMP_THREADS_BIND" not in os.environ:  # the app's layout, as prepare_process_env picks it
        env.update(worker_thread_env(os.sched_getaffinity(0)))
    flags = ["--long-prefill-token-threshold", str(settings.long_prefill_token_threshold)]
    if settings.priority_scheduling:
        flags += ["--scheduling-policy", "priority"]
    return env, flags


def plain_phase(model_dir: str, arguments: argparse.Namespace, index: int, arm: str) -> dict[str, Any]:
    env, flags = app_engine_options(Settings.from_env({})) if arm == "plain" else ({}, [])
    server = VllmServer(
        Path(model_dir),
        arguments.out / f"{arm}-{index}.log",
        arguments.max_model_len,
        "--max-num-seqs",
        "64",
        *flags,
    )
    server.env.update(env)
    server.start()
    try:
        return run_phase(
            server.url, model_dir, model_dir, arguments, loads(arguments), None, f"{arm}-{index}"
        )
    finally:
        server.stop()


NO_USER_LIMITS = {"USER_MAX_CONCURRENT_TURNS": "0", "USER_TOKENS_PER_MINUTE": "0"}
APP_ARMS = {"app": {**NO_USER_LIMITS, "READING_PACE_TOKENS_PER_SECOND": "0"}, "app-admitted": NO_USER_LIMITS}


def app_phase(model_dir: str, arguments: argparse.Namespace, index: int, arm: str) -> dict[str, Any]:
    data_dir = tempfile.mkdtemp(prefix="api-overhead-data-")
    env = {
        "MODEL": model_dir,
        "MAX_MODEL_LEN": str(arguments.max_model_len),
        "MAX_NUM_SEQS": "64",
        "MAX_NUM_BATCHED_TOKENS": str(arguments.max_model_len),
        "DTYPE": "float32",
        "DATA_DIR": data_dir,
        "API_MODEL_NAME": "bench-model",
        **APP_ARMS[arm],
    }
    server = AppServer(env, arguments.out / f"{arm}-{index}.log").start()
    try:
        run_accounts = [sys.executable, "-m", "services.accounts"]
        account_env = {**os.environ, "DATA_DIR": data_dir}
        subprocess.run(
            [*run_accounts, "add", "bench", "--generate"],
            env=account_env,
            cwd=ROOT,
            check=True,
            capture_output=True,
        )
        made = subprocess.run(
            [*run_accounts, "key", "create", "bench"],
            env=account_env,
            cwd=ROOT,
            check=True,
            capture_output=True,
            text=True,
        )
        key = made.stdout.split()[0]
        return run_phase(
            server.base_url, "bench-model", model_dir, arguments, loads(arguments), key, f"{arm}-{index}"
        )
    finally:
        server.stop()
        with contextlib.suppress(OSError):
            subprocess.run(["rm", "-rf", data_dir], check=False)


def median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def main() -> int:
    arguments = parse_arguments()
    arguments.out.mkdir(parents=True, exist_ok=True)
    model_dir = arguments.model or str(ensure_default_model(Settings.from_env({})))
    started = time.time()
    phases: dict[str, list[dict[str, Any]]] = {
        "plain": [],
        "app": [],
        "app-admitted": [],
        "plain-vllm-defaults": [],
    }
    for index in range(arguments.rounds):
        phases["plain"].append(plain_phase(model_dir, arguments, index, "plain"))
        phases["app"].append(app_phase(model_dir, arguments, index, "app"))
        if index < arguments.admitted_rounds:
            phases["app-admitted"].append(app_phase(model_dir, arguments, index, "app-admitted"))
        if index == 0 and not arguments.quick:
            defaults = "plain-vllm-defaults"
            phases[defaults].append(plain_phase(model_dir, arguments, index, defaults))
    expected = {kind: load.prompts for kind, load in loads(arguments).items()}
    incomplete = [
        f"{name}/{kind}"
        for name in ("plain", "app")
        for run in phases[name]
        for kind, result in run.items()
        if result["completed"] < expected[kind]
    ]

    def middle(arm: str, kind: str, metric: str) -> float:
        return median([run[kind][metric] for run in phases[arm]])

    plain_tps = middle("plain", "load", "output_throughput")
    app_tps = middle("app", "load", "output_throughput")
    added_ttft = middle("app", "single", "median_ttft_ms") - middle("plain", "single", "median_ttft_ms")
    added_ttft_under_load = middle("app", "load", "median_ttft_ms") - middle(
        "plain", "load", "median_ttft_ms"
    )
    summary = {
        "benchmark": "api_overhead",
        "when": datetime.now().isoformat(timespec="seconds"),
        "seconds": round(time.time() - started),
        "machine": machine_info(),
        "arguments": {k: str(v) for k, v in vars(arguments).items()},
        "model": model_dir,
        "phases": phases,
        "throughput_ratio": round(app_tps / plain_tps, 3),
        "ttft_p50_added_ms": round(added_ttft, 1),
        "ttft_p50_added_ms_under_load": round(added_ttft_under_load, 1),
        "targets": {
            "throughput_ratio_min": TARGET_THROUGHPUT_RATIO,
            "ttft_p50_added_ms_max": TARGET_TTFT_ADDED_MS,
        },
    }
    if defaults := phases["plain-vllm-defaults"]:  # the app's engine environment against vLLM's own
        reference, vllm_own = phases["plain"][0]["load"], defaults[0]["load"]
        summary["engine_env_vs_vllm_defaults"] = {
            "throughput_ratio": round(reference["output_throughput"] / vllm_own["output_throughput"], 3),
            "ttft_p50_added_ms": round(reference["median_ttft_ms"] - vllm_own["median_ttft_ms"], 1),
        }
    summary["incomplete_phases"] = incomplete
    summary["met"] = (
        not incomplete
        and summary["throughput_ratio"] >= TARGET_THROUGHPUT_RATIO
        and added_ttft <= TARGET_TTFT_ADDED_MS
    )
    headline = (
        "throughput_ratio",
        "ttft_p50_added_ms",
        "ttft_p50_added_ms_under_load",
        "met",
        "incomplete_phases",
        "seconds",
    )
    print(json.dumps({k: summary[k] for k in headline}))
    for name, runs in phases.items():
        for run in runs:
            print(name, json.dumps(run))
    if arguments.save_results:
        target = result_path("overhead", "api_overhead")
        target.write_text(json.dumps(summary, indent=2) + "\n")
        print(f"saved {target}")
    return 1 if incomplete else 0


if __name__ == "__main__":
    sys.exit(main())
