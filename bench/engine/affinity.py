"""Routing between vLLM servers: follow-up time to first token and throughput, the app's own routing
against vLLM's router, side by side.

    .venv/bin/python bench/engine/affinity.py                      # default model, ~10 minutes here
    .venv/bin/python bench/engine/affinity.py --rounds 1 --turns 3 # a validation run

Starts two vLLM servers (the module form of `vllm serve`) on loopback, each worker on its own core,
and three `vllm-router`s in front of them (policies consistent_hash, cache_aware, round_robin), and
drives them through the app's own RemoteLLM + ChatEngine, once per arm: `affinity` (ENGINE_URLS =
the servers, ENGINE_AFFINITY: a conversation stays on the server holding its prefix), `by_load`
(the same, fewest of our requests in flight), and `router_<policy>` (ENGINE_URLS = that router,
ENGINE_ROUTER: each request carries its conversation's X-Session-Id). Arms alternate round by
round, side by side in one run, on the same servers. Each round
runs --conversations conversations at once, each about a document of its own (~1,500 tokens in
the system message, as after an upload) with --turns questions; a follow-up's prompt is the
previous one plus the answer and the new question, so a server that served the previous turn
has all but the last few dozen tokens in its prefix cache. Behind a router the app cannot see which
server took a request, so each arm also reports the servers' own prefix-cache hit share over its
turns (vLLM's counters, read before and after each arm's round). Writes
bench/out/affinity-<time>/summary.json; --save-results copies it to bench/results/engine/.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import urllib.request

from bench.common import machine_info, percentile, result_path
from harness.documents import long_document
from harness.router import VllmRouter
from harness.server import VllmServer
from services.config import Settings
from services.engine import ChatEngine, SamplingSettings
from services.engine.backends.local import ensure_default_model
from services.engine.backends.remote import RemoteLLM
from services.engine.backends.remote.routing import ENGINE_AFFINITY_SLACK
from services.engine.route_hint import set_route_hint

MAX_MODEL_LEN = 8192
OWN_ARMS = {"affinity": ENGINE_AFFINITY_SLACK, "by_load": None}  # None = affinity off
ROUTER_POLICIES = ("consistent_hash", "cache_aware", "round_robin")  # arms router_<policy>


class TracedRemote(RemoteLLM):
    """RemoteLLM that remembers which server took each request (for this measurement only)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.served_by: dict[str, str] = {}

    async def _open_stream(self, prompt_ids, params, request_id, *args: Any):
        server, response = await super()._open_stream(prompt_ids, params, request_id, *args)
        self.served_by[request_id] = server.url
        return server, response


async def conversation(
    engine: ChatEngine, remote: TracedRemote, document: str, turns: int, tag: str, pauses: list[float]
) -> list[dict]:
    """One conversation about `document`; per turn: TTFT and whether it landed where the last one did.
    `pauses[turn]` seconds pass before each turn (a person reading), so conversations interleave
    unevenly, as people do: in lockstep, fewest-in-flight ties and keeps every conversation in place."""
    set_route_hint(tag, "bench")  # this conversation's task only; read by the router arms
    messages = [{"role": "system", "content": f"You answer questions about this document.\n\n{document}"}]
    sampling = SamplingSettings(0.0, 1.0, 24)
    records = []
    previous = None
    for turn in range(turns):
        await asyncio.sleep(pauses[turn])
        messages.append(
            {"role": "user", "content": f"Question {turn + 1}: what does section {turn + 1} say?"}
        )
        started = time.monotonic()
        first = None
        parts = []
        async for delta in engine.generate(messages, sampling, f"{tag}-t{turn}"):
            first = first or time.monotonic()
            parts.append(delta)
        served_by = remote.served_by[f"{tag}-t{turn}"]
        records.append(
            {
                "turn": turn,
                "ttft_seconds": (first or time.monotonic()) - started,
                # behind a router we see the router only: which server took it, the router knows
                "same_server": None if remote.router else previous == served_by,
                "answer_tokens": engine.count_tokens("".join(parts)),
            }
        )
        previous = served_by
        messages.append({"role": "assistant", "content": "".join(parts)})
    return records


def prefix_cache_counts(urls: list[str]) -> tuple[float, float]:
    """vLLM's prefix-cache hits and queries (tokens), summed over the servers."""
    from prometheus_client.parser import text_string_to_metric_families

    hits = queries = 0.0
    for url in urls:
        with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
            text = response.read().decode()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "vllm:prefix_cache_hits_total":
                    hits += sample.value
                elif sample.name == "vllm:prefix_cache_queries_total":
                    queries += sample.value
    return hits, queries


async def run_round(
    engines: dict[str, tuple[ChatEngine, TracedRemote]], options, round_: int, urls: list[str]
) -> dict[str, list]:
    results: dict[str, list] = {}
    for arm, (name, (engine, remote)) in enumerate(engines.items()):
        # a document of its own for every conversation of every arm and round: no arm finds another's
        # prefix in the servers' caches
        seeds = [100_000 * round_ + 1000 * arm + i for i in range(options.conversations)]
        documents = [long_document(1100, seed=seed) for seed in seeds]
        timing = random.Random(round_)  # the same pauses for every arm
        pauses = [[timing.uniform(0, options.pause) for _ in range(options.turns)] for _ in documents]
        started = time.monotonic()
        cache_before = prefix_cache_counts(urls)
        batches = await asyncio.gather(
            *(
                conversation(engine, remote, doc, options.turns, f"{name}-r{round_}-c{i}", pauses[i])
                for i, doc in enumerate(documents)
            )
        )
        seconds = time.monotonic() - started
        (hits_after, queries_after), (hits_before, queries_before) = prefix_cache_counts(urls), cache_before
        hits, queries = hits_after - hits_before, queries_after - queries_before
        cache = {"round": round_, "round_seconds": seconds, "cache_hits": hits, "cache_queries": queries}
        results[name] = [{**record, **cache} for batch in batches for record in batch]
        print(name, "round", round_, [round(r["ttft_seconds"], 2) for r in results[name]], flush=True)
    return results


def summary(records: list[dict]) -> dict[str, Any]:
    follow_ups = [r for r in records if r["turn"] > 0]
    ttfts = [r["ttft_seconds"] for r in follow_ups]
    firsts = [r["ttft_seconds"] for r in records if r["turn"] == 0]
    rounds = {r["round"]: (r["round_seconds"], r["cache_hits"], r["cache_queries"]) for r in records}
    return {
        "follow_ups": len(follow_ups),
        "follow_up_ttft_seconds": {f"p{q}": round(percentile(ttfts, q) or 0, 3) for q in (50, 95)},
        "first_turn_ttft_seconds": {"p50": round(percentile(firsts, 50) or 0, 3)},
        # prompt tokens the servers found in their prefix cache, over all the arm's turns
        "prefix_cache_hit_share": round(
            sum(hits for _, hits, _ in rounds.values()) / max(1.0, sum(q for _, _, q in rounds.values())), 3
        ),
        "follow_ups_on_the_same_server": None
        if any(r["same_server"] is None for r in follow_ups)
        else round(sum(r["same_server"] for r in follow_ups) / max(1, len(follow_ups)), 3),
        # answer tokens over the rounds' wall time (pauses included: the same for every arm)
        "tokens_per_second": round(
            sum(r["answer_tokens"] for r in records) / max(1e-9, sum(s for s, _, _ in rounds.values())),
            2,
        ),
    }


async def measure(urls: list[str], routers: dict[str, str], options) -> dict[str, Any]:
    from vllm.tokenizers import get_tokenizer

    tokenizer = get_tokenizer(str(options.model))
    arms: dict[str, tuple[list[str], int | None, bool]] = {
        **{name: (urls, slack, False) for name, slack in OWN_ARMS.items()},
        **{f"router_{policy}": ([url], None, True) for policy, url in routers.items()},
    }
    engines = {}
    for name, (targets, slack, router) in arms.items():
        remote = TracedRemote(
            targets,
            tokenizer,
            connect_timeout=10,
            idle_timeout=900,
            max_connections=64,
            affinity_slack=slack,
            router=router,
        )
        await remote.connect()
        engines[name] = (ChatEngine(remote, remote.max_model_len), remote)
    collected: dict[str, list] = {name: [] for name in arms}
    try:
        for round_ in range(options.rounds):
            for name, records in (await run_round(engines, options, round_, urls)).items():
                collected[name].extend(records)
    finally:
        for _, remote in engines.values():
            await remote.aclose()
    report: dict[str, Any] = {name: summary(records) for name, records in collected.items()}
    baseline = report["by_load"]["follow_up_ttft_seconds"]["p50"]
    report["follow_up_ttft_p50_vs_by_load"] = {
        name: round(report[name]["follow_up_ttft_seconds"]["p50"] / baseline, 3) if baseline else None
        for name in arms
    }
    return report


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--conversations", type=int, default=6)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument(
        "--pause", type=float, default=3.0, help="Seconds before each turn: uniform in [0, this]."
    )
    parser.add_argument("--model", type=Path, default=None, help="Default: the bundled default model.")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--save-results", action="store_true", help="copy the summary to bench/results/engine/"
    )
    options = parser.parse_args()
    options.model = options.model or ensure_default_model(Settings.from_env({}))
    out = options.out or ROOT / "bench" / "out" / f"affinity-{datetime.now():%Y%m%d-%H%M%S}"
    out.mkdir(parents=True, exist_ok=True)
    servers: list[VllmServer] = []
    routers: list[VllmRouter] = []
    try:
        for core in (0, 1):  # one worker per core, as two machines would have their own
            server = VllmServer(options.model, out / f"vllm-{core}.log", MAX_MODEL_LEN)
            server.env["VLLM_CPU_OMP_THREADS_BIND"] = str(core)
            servers.append(server.start(timeout=600))
        urls = [s.url for s in servers]
        routers = [VllmRouter(urls, out / f"router-{p}.log", policy=p).start() for p in ROUTER_POLICIES]
        report = {"run": {"command": " ".join(sys.argv), "machine_before": machine_info()}}
        by_policy = {policy: router.url for policy, router in zip(ROUTER_POLICIES, routers, strict=True)}
        report.update(asyncio.run(measure(urls, by_policy, options)))
        report["run"]["machine_after"] = machine_info()
    finally:
        for part in (*routers, *servers):
            part.stop()
    (out / "summary.json").write_text(json.dumps(report, indent=2))
    if options.save_results:
        result_path("engine", "affinity").write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
