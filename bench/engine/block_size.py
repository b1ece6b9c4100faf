"""KV-cache block size: vLLM's CPU default (128) against smaller blocks, on a plain vLLM server.

    .venv/bin/python bench/engine/block_size.py                 # 128 against 32, one round (~4 min)
    .venv/bin/python bench/engine/block_size.py --sizes 128,64,32 --rounds 2

Prefix caching works in whole blocks, so a prompt that repeats a cached one
re-reads its last partial block: up to 127 tokens at 128. Each phase starts
`python -m vllm.entrypoints.openai.api_server` with the app's engine
environment (bench/overhead/api_layer.py) and `--block-size N`, then runs vLLM's
serving benchmark twice with the same random prompts (512 tokens in): `load`,
32 prompts at concurrency 8, 128 tokens out (throughput, TPOT), then `single`,
12 prompts one at a time, 16 tokens out. They are the `load` prompts again, so
their TTFT is the time to re-read a cached prompt, which is what a follow-up
pays. Phases run in turn, never two engines at once.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.overhead.api_layer import Load, app_engine_options, run_phase
from harness.server import VllmServer
from services.config import Settings
from services.engine.backends.local import ensure_default_model

KEPT = ("output_throughput", "median_ttft_ms", "median_tpot_ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="128,32", help="block sizes, comma-separated")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "block-size")
    arguments = parser.parse_args()
    arguments.endpoint = "/v1/completions"
    arguments.out.mkdir(parents=True, exist_ok=True)
    settings = Settings.from_env({})
    model = str(ensure_default_model(settings))
    env, flags = app_engine_options(settings)
    runs = {"load": Load(32, 8, 512, 128), "single": Load(12, 1, 512, 16)}
    results: dict[str, list[dict]] = {}
    for index in range(arguments.rounds):
        for size in arguments.sizes.split(","):
            server = VllmServer(
                Path(model),
                arguments.out / f"{size}-{index}.log",
                4096,
                "--max-num-seqs",
                "64",
                "--block-size",
                size,
                *flags,
            )
            server.env.update(env)
            server.start()
            try:
                phase = run_phase(server.url, model, model, arguments, runs, None, f"{size}-{index}")
            finally:
                server.stop()
            results.setdefault(size, []).append(
                {kind: {name: round(value[name], 1) for name in KEPT} for kind, value in phase.items()}
            )
            print(size, json.dumps(results[size][-1]), flush=True)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
