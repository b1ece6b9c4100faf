"""/metrics, the probes (/healthz, /readyz, /livez) and /stats on the shared tiny-model server, read as
operators and balancers read them."""

from __future__ import annotations

import asyncio
import json
import math
import urllib.error
import urllib.request
from collections import Counter

import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness.chat_client import ChatClient
from harness.server import AppServer
from harness.waiting import until
from tests.conftest import TINY_OPS_TOKEN

pytestmark = pytest.mark.asyncio(loop_scope="module")

CHAT_HISTOGRAMS = (
    "chat_request_queue_time_seconds",
    "chat_time_to_first_token_seconds",
    "chat_inter_token_latency_seconds",
    "chat_e2e_request_latency_seconds",
    "chat_request_generation_tokens",
)


def scrape(server: AppServer) -> tuple[str, dict[str, list]]:
    """The /metrics text and its samples by name: [(labels, value), ...]."""
    with server.open("/metrics", 10) as response:
        assert response.headers["Content-Type"].startswith("text/plain"), "not Chainlit's page"
        text = response.read().decode()
    samples: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((sample.labels, sample.value))
    return text, samples


def total(samples: dict[str, list], name: str, **labels: str) -> float:
    """Sum of a metric's samples whose labels include `labels`."""
    return sum(v for got, v in samples.get(name, []) if labels.items() <= got.items())


async def idle(server: AppServer) -> None:
    await server.poll(
        lambda s: s["engine_unfinished_requests"] == 0 and s["turns_in_flight"] == 0, timeout=10
    )


async def test_metrics_histograms_count_the_requests_sent(tiny_server: AppServer) -> None:
    await idle(tiny_server)
    _, before = await asyncio.to_thread(scrape, tiny_server)
    clients = [ChatClient(tiny_server.base_url) for _ in range(3)]
    await asyncio.gather(*(c.connect() for c in clients))
    try:
        for round_ in range(2):
            replies = await asyncio.gather(
                *(c.ask(f"Round {round_}, question {i}?") for i, c in enumerate(clients))
            )
            assert all(r.final for r in replies)
    finally:
        await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)
    await idle(tiny_server)
    _, after = await asyncio.to_thread(scrape, tiny_server)
    sent = 6
    for name in CHAT_HISTOGRAMS:
        counted = total(after, f"{name}_count") - total(before, f"{name}_count")
        if name == "chat_inter_token_latency_seconds":
            assert 0 < counted <= sent, "one value per request that produced two tokens or more"
        else:
            assert counted == sent, f"{name}: {counted} observations for {sent} requests"
    finished = {
        reason: total(after, "chat_requests_finished_total", finished_reason=reason)
        - total(before, "chat_requests_finished_total", finished_reason=reason)
        for reason in ("stop", "length", "abort")
    }
    assert finished["stop"] + finished["length"] == sent and finished["abort"] == 0, finished
    engine_counted = total(after, "vllm:e2e_request_latency_seconds_count") - total(
        before, "vllm:e2e_request_latency_seconds_count"
    )
    assert engine_counted == sent, "vLLM's own histogram saw the same requests"
    assert total(after, "chat_time_to_first_token_seconds_sum") > total(
        before, "chat_time_to_first_token_seconds_sum"
    )


async def test_metrics_include_engine_metrics_and_memory_of_every_process(tiny_server: AppServer) -> None:
    text, samples = await asyncio.to_thread(scrape, tiny_server)
    for name in ("vllm:num_requests_running", "vllm:kv_cache_usage_perc", "vllm:time_to_first_token_seconds"):
        assert name in text, f"vLLM's own {name} is served"
    rss = {
        labels["process"]: value
        for labels, value in samples["chat_process_memory_bytes"]
        if labels["kind"] == "rss"
    }
    assert {"app", "EngineCore", "Worker"} <= rss.keys(), rss
    assert all(value > 50e6 for role, value in rss.items() if role in ("app", "EngineCore", "Worker"))
    kinds = Counter(labels["kind"] for labels, _ in samples["chat_process_memory_bytes"])
    assert {"rss", "vms", "uss", "anon", "swap"} <= kinds.keys()
    tree = {labels["kind"]: value for labels, value in samples["chat_process_tree_memory_bytes"]}
    assert tree["rss"] >= sum(rss.values()) * 0.99
    assert total(samples, "chat_asyncio_tasks") > 0
    assert "chat_event_loop_lag_seconds" in samples and "chat_event_loop_lag_max_seconds" in samples
    growth = total(samples, "chat_memory_growth_mb_per_hour")
    assert math.isnan(growth), "no slope during LEAK_WARMUP_SECONDS"
    assert total(samples, "chat_memory_leak_alarm") == 0
    assert "chat_sessions" in samples and "chat_turns_in_flight" in samples


async def test_healthz_is_200_with_detail_while_the_engine_answers(tiny_server: AppServer) -> None:
    detail = await asyncio.to_thread(tiny_server.get_json, "/healthz", 30)
    assert detail["ready"] and detail["engine_alive"]
    assert len(detail["engine_processes"]) >= 2 and all(p["running"] for p in detail["engine_processes"])
    assert "last_output_seconds_ago" in detail or "ping_seconds" in detail


async def test_ops_routes_need_the_token_and_the_probes_do_not(tiny_server: AppServer) -> None:
    for path in ("/status", "/metrics", "/stats"):
        for header in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TINY_OPS_TOKEN}):
            request = urllib.request.Request(tiny_server.base_url + path, headers=header)
            with pytest.raises(urllib.error.HTTPError) as refused:
                await asyncio.to_thread(urllib.request.urlopen, request, timeout=10)
            assert refused.value.code == 401, (path, header)
    for path, statuses in (
        ("/healthz", ("ok", "overloaded")),
        ("/readyz", ("ready",)),
        ("/livez", ("alive",)),
    ):
        request = urllib.request.Request(tiny_server.base_url + path)  # load balancers have no token
        with await asyncio.to_thread(urllib.request.urlopen, request, timeout=30) as response:
            shown = json.loads(response.read())
            assert response.status == 200 and list(shown) == ["status"] and shown["status"] in statuses, path


async def test_readyz_tells_operators_what_it_checked_and_metrics_export_the_tiers(
    tiny_server: AppServer,
) -> None:
    """/readyz (what balancers route on) never asks the engine; /healthz's detail and /metrics say
    how many model servers answer and what the database is doing (engine dead, router down, a
    database outage: tests/unit/test_readiness.py)."""
    assert await asyncio.to_thread(tiny_server.probe, "/readyz") == (
        200,
        {"status": "ready", "started": True, "draining": False, "database": "reachable"},
    )
    detail = await asyncio.to_thread(tiny_server.get_json, "/healthz", 30)
    assert detail["engine_servers"]["state"] == "all" and detail["engine_servers"]["remote"] is False
    assert detail["database"] == {"kind": "sqlite", "state": "reachable", "shared": False}
    _, samples = await asyncio.to_thread(scrape, tiny_server)
    assert total(samples, "chat_ready") == 1 and total(samples, "chat_engine_servers_answering") == 1
    assert total(samples, "chat_database_state", state="reachable") == 1
    assert total(samples, "chat_database_shared") == 0, "SQLite: each process counts its own"


async def test_stats_summarises_latency_memory_and_uptime(tiny_server: AppServer) -> None:
    stats = await asyncio.to_thread(tiny_server.get_json, "/stats")
    assert stats["uptime_seconds"] > 0
    for key in ("queue_seconds", "ttft_seconds", "e2e_seconds", "output_tokens"):
        percentiles = stats["requests"][key]
        assert 0 <= percentiles["p50"] <= percentiles["p95"] <= percentiles["p99"], (key, percentiles)
    memory = stats["memory"]
    assert {p["role"] for p in memory["processes"]} >= {"app", "EngineCore", "Worker"}
    # Growth per process, in MB/hour and bytes per request: None until the warm-up has passed.
    assert all({"mb_per_hour", "bytes_per_request"} <= set(p) for p in memory["processes"])
    assert memory["tree_mb"]["anon_swap"] > 0
    assert memory["growth_mb_per_hour"] is None and memory["leak_alarm"] is False
    assert stats["event_loop_lag_seconds"]["max_last_minute"] >= 0
    assert stats["sessions"] >= 0 and "maintenance" in stats


async def test_stats_command_shows_the_numbers_and_a_plot(tiny_server: AppServer) -> None:
    client = ChatClient(tiny_server.base_url)
    elements: list[dict] = []
    client.sio.on("element", elements.append)
    await client.connect()
    try:
        reply = await client.ask("/stats", timeout=60)
        await until(lambda: elements, "the image element, which follows the message")
    finally:
        await client.close()
    assert "Service stats" in reply.final and "Time to first token" in reply.final, reply.final
    assert [(e["type"], e["mime"]) for e in elements] == [("image", "image/png")], elements
