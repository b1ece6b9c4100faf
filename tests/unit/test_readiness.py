"""Readiness, liveness and the engine tier (services/observability/readiness.py, status.py) without a
server: a replica stays ready while the engine tier is down, /healthz's detail and /metrics say how
many model servers answer (through a real `chainlit run`: tests/system/ops/test_metrics.py)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from services.config import Settings
from services.engine.backends.remote import RemoteLLM, ServerUnreachableError
from services.history.service import History
from services.observability.readiness import engine_tier, readiness, readiness_metrics, servers_state
from services.observability.status import ServiceStatus

Handler = Callable[[httpx.Request], httpx.Response]


def test_the_model_servers_answering_are_all_some_or_none() -> None:
    assert [servers_state(a, k) for a, k in ((2, 2), (1, 2), (0, 2), (0, 0), (3, 2))] == [
        "all",
        "some",
        "none",
        "none",
        "all",
    ]


@pytest.mark.parametrize(
    ("started", "draining", "database", "ready"),
    [
        (True, False, "reachable", True),
        (True, False, "none", True),  # anonymous: nothing stored
        (True, False, "fallback", True),  # down: chat goes on unsaved, the probe retries
        (True, False, "lost", False),  # down and nothing retries
        (True, True, "reachable", False),  # stopping
        (False, False, "reachable", False),  # not started
    ],
)
def test_a_replica_is_ready_when_started_not_stopping_and_its_database_serves_or_falls_back(
    started: bool, draining: bool, database: str, ready: bool
) -> None:
    answer, detail = readiness(started, draining, database)
    assert answer is ready and detail["status"] == ("ready" if ready else "not ready")
    assert detail["database"] == database and "engine" not in str(detail), "never the engine"


def test_the_database_state_follows_the_breaker_and_its_probe(tmp_path: Path) -> None:
    settings = Settings.from_env({"DATA_DIR": str(tmp_path)})
    assert History(settings, keep_conversations=False, use_database=False).database_state == "none"
    history = History(settings, keep_conversations=True, use_database=True)
    assert history.database_state == "lost", "not started: nothing retries yet"
    history.migrated = True
    assert history.database_state == "reachable"
    history.health.failed(ConnectionRefusedError("connection refused"))
    assert history.database_state == "lost"
    history._probe = SimpleNamespace(done=lambda: False)  # type: ignore[assignment]
    assert history.database_state == "fallback"


def remote(handler: Handler, *urls: str, router: bool = False) -> RemoteLLM:
    llm = RemoteLLM(list(urls), None, connect_timeout=2, idle_timeout=2, max_connections=4, router=router)
    llm._client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    return llm


def only_a_up(request: httpx.Request) -> httpx.Response:
    if request.url.host == "a":
        return httpx.Response(200)
    raise httpx.ConnectError("refused", request=request)


@pytest.mark.asyncio(loop_scope="function")
async def test_health_checks_count_the_servers_that_answer() -> None:
    llm = remote(only_a_up, "http://a:8000", "http://b:8000")
    assert engine_tier(llm, True, time.monotonic()).state == "unknown"
    await llm.check_health()
    tier = engine_tier(llm, True, time.monotonic())
    assert (tier.state, tier.answering, tier.known, tier.remote) == ("some", 1, 2, True)
    await llm.aclose()


@pytest.mark.asyncio(loop_scope="function")
async def test_behind_a_router_its_listed_servers_are_counted_and_a_router_down_counts_none() -> None:
    up = [True]

    def router(request: httpx.Request) -> httpx.Response:
        if not up[0]:
            raise httpx.ConnectError("refused", request=request)
        workers = [
            {"url": "http://v1:8000", "is_healthy": True},
            {"url": "http://v2:8000", "is_healthy": False},
        ]
        return httpx.Response(200, json={"workers": workers})

    llm = remote(router, "http://router:8000", router=True)
    await llm.check_health()
    assert llm.servers_answering == (1, 2)
    up[0] = False
    with pytest.raises(ServerUnreachableError):
        await llm.check_health()
    assert llm.servers_answering == (0, 2) and engine_tier(llm, True, time.monotonic()).state == "none"
    await llm.aclose()


class Engine:
    """The parts of ChatEngine that ServiceStatus reads, over `backend`."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.alive = True
        self.load = SimpleNamespace(running=0, waiting=0)
        self.last_output_at = time.monotonic()

    def unfinished_requests(self) -> int:
        return 0

    async def check_health(self) -> None:
        await self.backend.check_health()


def service_status(backend: Any) -> tuple[ServiceStatus, SimpleNamespace]:
    admission = SimpleNamespace(overloaded=False, shared=None)
    parts = SimpleNamespace(engine=Engine(backend), engine_processes=[], admission=admission)
    return ServiceStatus(Settings.from_env({}), None, lambda: parts), parts  # type: ignore[arg-type, return-value]


def gauges(status: ServiceStatus) -> dict[str, float]:
    """What ServiceCollector exports of readiness and the tier (the rest reads parts not faked here)."""
    tier = status.tier_detail(status.running())  # type: ignore[arg-type]
    metrics = readiness_metrics(status.readiness()[0], tier)
    return {s.name + str(s.labels or ""): s.value for family in metrics for s in family.samples}


@pytest.mark.asyncio(loop_scope="function")
async def test_the_engine_tier_down_leaves_the_replica_ready_and_alive_and_healthz_says_so() -> None:
    """The router stopped: /healthz is 503 with no model server answering, /readyz and /livez stay
    200, so a balancer keeps the replica and people get the app's "the model is not available"."""
    state = {"a": True, "b": True}

    def servers(request: httpx.Request) -> httpx.Response:
        if state[request.url.host]:
            return httpx.Response(200)
        raise httpx.ConnectError("refused", request=request)

    llm = remote(servers, "http://a:8000", "http://b:8000")
    status, _ = service_status(llm)
    healthy, detail = await status.health()
    assert healthy and detail["status"] == "ok" and detail["engine_servers"]["state"] == "all"
    assert detail["database"] == {"kind": "none", "state": "none", "shared": False}
    state["b"] = False
    healthy, detail = await status.health()
    assert healthy and detail["status"] == "degraded", "half the servers dead is not ok"
    assert gauges(status)["chat_engine_servers_answering"] == 1
    state["a"] = False
    healthy, detail = await status.health()
    assert not healthy and detail["status"] == "down" and detail["engine_servers"]["state"] == "none"
    assert status.readiness() == (
        True,
        {"status": "ready", "started": True, "draining": False, "database": "none"},
    )
    assert status.liveness()[0], "restarting the app would not bring the servers back"
    numbers = gauges(status)
    assert numbers["chat_ready"] == 1 and numbers["chat_engine_servers_answering"] == 0
    assert numbers["chat_engine_servers_known"] == 2 and numbers["chat_database_state{'state': 'none'}"] == 1
    status.draining = True
    assert status.readiness()[1]["status"] == "not ready" and gauges(status)["chat_ready"] == 0
    await llm.aclose()


@pytest.mark.asyncio(loop_scope="function")
async def test_an_in_process_engine_that_died_fails_liveness_not_readiness() -> None:
    status, parts = service_status(SimpleNamespace(check_health=None))
    parts.engine.alive = False
    healthy, detail = await status.health()
    assert not healthy and detail["engine_servers"] == {
        "state": "none",
        "answering": 0,
        "known": 1,
        "remote": False,
        "checked_seconds_ago": 0.0,
    }
    assert status.readiness()[0] and status.liveness() == (
        False,
        {"status": "dead", "error": "the engine process is not running"},
    )
