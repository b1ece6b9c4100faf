"""The load of vLLM servers (ENGINE_URLS), read from their own Prometheus /metrics once a second.

The same numbers an in-process engine hands its stat loggers: requests running
and waiting, tokens generated and prefilled, summed over the servers and fed
to one `EngineLoad`, from which admission learns the fleet's decode speed.
Behind a router (ENGINE_ROUTER) the servers are the ones the router lists at
its /list_workers (vLLM's router), asked again every WORKERS_EVERY_POLLS polls;
a router that lists none is read itself.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence

import httpx
from prometheus_client.parser import text_string_to_metric_families

from services.engine.backends.remote.routing import Server
from services.engine.load import EngineLoad

logger = logging.getLogger(__name__)

POLL_SECONDS = 1.0
WORKERS_EVERY_POLLS = 10
MAX_WORKERS = 256  # a router listing more is read for its first this many
GAUGES = RUNNING, WAITING = ("vllm:num_requests_running", "vllm:num_requests_waiting")
COUNTERS = GENERATED, PROMPTED = ("vllm:generation_tokens_total", "vllm:prompt_tokens_total")


def read_load(text: str) -> dict[str, float]:
    """The four numbers above from one /metrics page (summed over label sets)."""
    values = dict.fromkeys(GAUGES + COUNTERS, 0.0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in values:
                values[sample.name] += sample.value
    return values


async def router_workers(client: httpx.AsyncClient, router: str) -> list[str]:
    """The servers a router routes to, from its /list_workers (empty when it has no such page)."""
    try:
        response = await client.get(f"{router}/list_workers", timeout=POLL_SECONDS * 5)
        urls = response.json().get("urls") if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError, AttributeError):
        return []
    if not isinstance(urls, list):
        return []
    return [url.rstrip("/") for url in urls[:MAX_WORKERS] if isinstance(url, str) and url.startswith("http")]


async def poll_load_forever(
    client: httpx.AsyncClient,
    servers: Sequence[Server],
    load: EngineLoad,
    router: bool = False,
    ours: Callable[[], int] = lambda: 0,
) -> None:
    """Every POLL_SECONDS: read each server's /metrics, record the sum (token counts as increases).
    With `router`, `servers` is the router, and the servers read are the ones it lists. `ours`: this
    process's requests at the servers; the rest of what they hold is others' (`EngineLoad.foreign`)."""
    previous: dict[str, dict[str, float]] = {}
    urls = [server.url for server in servers]
    polls = 0
    while True:
        if router and polls % WORKERS_EVERY_POLLS == 0:
            urls = await router_workers(client, servers[0].url) or [servers[0].url]
            previous = {url: values for url, values in previous.items() if url in urls}
        polls += 1
        totals = dict.fromkeys(GAUGES + COUNTERS, 0.0)
        answered = bool(urls)
        for url in urls:
            try:
                response = await client.get(f"{url}/metrics", timeout=POLL_SECONDS * 5)
                values = read_load(response.text)
            except (httpx.HTTPError, ValueError):
                answered = False  # others' share unknown: it goes stale, then counts as none
                continue  # a server that does not answer adds nothing; /healthz tells about it
            before = previous.get(url, values)
            previous[url] = values
            for name in GAUGES:
                totals[name] += values[name]
            for name in COUNTERS:
                totals[name] += max(0.0, values[name] - before[name])
        now = time.monotonic()
        running = int(totals[RUNNING])
        waiting = int(totals[WAITING])
        load.record(now, running, waiting, int(totals[GENERATED]), int(totals[PROMPTED]))
        if answered:
            load.note_foreign(now, running + waiting, ours())
        await asyncio.sleep(POLL_SECONDS)
