"""The load of vLLM servers (ENGINE_URLS), read from their own Prometheus /metrics once a second.

The same numbers an in-process engine hands its stat loggers: requests running
and waiting, tokens generated and prefilled, summed over the servers and fed
to one `EngineLoad`, from which admission learns the fleet's decode speed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

import httpx
from prometheus_client.parser import text_string_to_metric_families

from services.engine.backends.remote.routing import Server
from services.engine.load import EngineLoad

logger = logging.getLogger(__name__)

POLL_SECONDS = 1.0
GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting")
COUNTERS = ("vllm:generation_tokens_total", "vllm:prompt_tokens_total")


def read_load(text: str) -> dict[str, float]:
    """The four numbers above from one /metrics page (summed over label sets)."""
    values = dict.fromkeys(GAUGES + COUNTERS, 0.0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in values:
                values[sample.name] += sample.value
    return values


async def poll_load_forever(client: httpx.AsyncClient, servers: Sequence[Server], load: EngineLoad) -> None:
    """Every POLL_SECONDS: read each server's /metrics, record the sum (token counts as increases)."""
    previous: dict[str, dict[str, float]] = {}
    while True:
        totals = dict.fromkeys(GAUGES + COUNTERS, 0.0)
        for server in servers:
            try:
                response = await client.get(f"{server.url}/metrics", timeout=POLL_SECONDS * 5)
                values = read_load(response.text)
            except (httpx.HTTPError, ValueError):
                continue  # a server that does not answer adds nothing; /healthz tells about it
            before = previous.get(server.url, values)
            previous[server.url] = values
            for name in GAUGES:
                totals[name] += values[name]
            for name in COUNTERS:
                totals[name] += max(0.0, values[name] - before[name])
        load.record(
            time.monotonic(),
            int(totals["vllm:num_requests_running"]),
            int(totals["vllm:num_requests_waiting"]),
            int(totals["vllm:generation_tokens_total"]),
            int(totals["vllm:prompt_tokens_total"]),
        )
        await asyncio.sleep(POLL_SECONDS)
