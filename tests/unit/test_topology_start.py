"""How deploy/topology.py starts its parts, without starting any: stages of parts that need nothing of
each other run together and say what they wait for, and the banner names every address (the whole
topology started: tests/system/scale/test_topology.py, long tier)."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from deploy.topology import Topology, banner, run_together, without_password


def test_a_stage_runs_its_parts_together_and_says_what_it_waits_for() -> None:
    said: list[str] = []
    started = time.monotonic()
    run_together([("quick", lambda: time.sleep(0.3)), ("slow", lambda: time.sleep(0.6))], said.append, 0.1)
    assert time.monotonic() - started < 0.85, "together (0.6 s), not one after the other (0.9 s)"
    assert said[0].startswith("waiting for quick, slow (") and said[-1].startswith("waiting for slow ("), said


def test_a_failed_part_is_raised_once_the_stage_is_done() -> None:
    finished: list[str] = []

    def broken() -> None:
        raise RuntimeError("vllm serve exited with 1")

    def slow() -> None:
        time.sleep(0.2)
        finished.append("slow")

    with pytest.raises(RuntimeError, match="exited with 1"):
        run_together([("vLLM server 1", broken), ("PostgreSQL", slow)], lambda line: None, 0.05)
    assert finished == ["slow"], "the others were waited for, so stopping the topology stops them too"


def test_postgresql_and_the_vllm_servers_start_together_then_router_replicas_balancer(tmp_path: Path) -> None:
    topology = Topology(tmp_path / "model", tmp_path / "logs")
    topology.cookie_secret = "secret"
    topology.engines = [SimpleNamespace(start=print, url=f"http://127.0.0.1:{p}") for p in (9101, 9102)]  # type: ignore[misc]
    stages = topology.stages()
    assert [name for name, _ in next(stages)] == ["PostgreSQL", "vLLM server 1", "vLLM server 2"]
    assert [name for name, _ in next(stages)] == ["vLLM's router"]
    topology.database_url = "postgresql://postgres@127.0.0.1:9100/chat"
    topology.router = SimpleNamespace(url="http://127.0.0.1:9103")  # type: ignore[assignment]
    assert [name for name, _ in next(stages)] == ["replica 1", "replica 2"]
    assert [r.log_path.name for r in topology.replicas] == ["app-1.log", "app-2.log"]
    assert all(r.env["ENGINE_URLS"] == "http://127.0.0.1:9103" for r in topology.replicas)
    assert all(r.env["DATABASE_URL"] == topology.database_url for r in topology.replicas)
    assert [name for name, _ in next(stages)] == ["HAProxy"]
    assert next(stages, None) is None


def test_the_banner_names_every_address_and_no_password() -> None:
    lines = banner(
        "http://127.0.0.1:8000",
        ["http://127.0.0.1:9201", "http://127.0.0.1:9202"],
        "http://127.0.0.1:9103",
        ["http://127.0.0.1:9101", "http://127.0.0.1:9102"],
        "postgresql://chat:hunter2@127.0.0.1:9100/chat",
    )
    text = "\n".join(lines)
    assert lines[0].startswith("open http://127.0.0.1:8000")
    for port in (9201, 9202, 9103, 9101, 9102):
        assert f"127.0.0.1:{port}" in text
    assert "database: postgresql://chat@127.0.0.1:9100/chat" in text and "hunter2" not in text
    assert (
        without_password("postgresql://postgres@127.0.0.1:9100/chat")
        == "postgresql://postgres@127.0.0.1:9100/chat"
    )
