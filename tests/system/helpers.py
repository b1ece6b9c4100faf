"""What the system tests of more than one module do to a running server: sign in, wait for its state
(a stored conversation, no turn in flight), read its metrics, watch the messages it sends a page.
The servers themselves and the accounts command are the conftests' (tests/conftest.py,
tests/system/conftest.py)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from harness.chat_client import ChatClient, Reply
from harness.server import AppServer
from harness.waiting import WAIT_SECONDS

HELLO = [{"role": "user", "content": "Say hello."}]  # the smallest chat request of the /v1 API
LONG_TURN_WORDS = 300  # an earlier turn big enough to show in the next prompt's token count


def data_dir(server: AppServer) -> Path:
    """The server's DATA_DIR: its SQLite database, for the accounts command (tests/system/conftest.py)."""
    return Path(server.env["DATA_DIR"])


# --- pages and their answers ---------------------------------------------------------------------
async def signed_in(server: AppServer, who: tuple[str, str]) -> ChatClient:
    client = ChatClient(server.base_url, *who)
    await client.connect()
    return client


@contextlib.asynccontextmanager
async def connected(server: AppServer, count: int = 1):
    clients = [ChatClient(server.base_url) for _ in range(count)]
    await asyncio.gather(*(client.connect() for client in clients))
    try:
        yield clients
    finally:
        await asyncio.gather(*(client.close() for client in clients), return_exceptions=True)


async def done(reply: Reply, timeout: float = 120) -> Reply:
    await asyncio.wait_for(reply.done.wait(), timeout)
    return reply


def collect_replies(client: ChatClient) -> list[dict]:
    """Every message the server sends this client from now on (refusals carry metadata.refused)."""
    seen: list[dict] = []
    client_handler = client.sio.handlers["/"]["new_message"]

    async def on_message(data: Any = None) -> None:
        if isinstance(data, dict):
            seen.append(data)
        await client_handler(data)

    client.sio.on("new_message", on_message)
    return seen


def refusals(seen: list[dict], reason: str) -> list[dict]:
    return [m for m in seen if (m.get("metadata") or {}).get("refused") == reason]


def idle(status: dict) -> bool:
    """A /status with no engine request and no turn running (for `AppServer.poll`)."""
    return status["engine_unfinished_requests"] == 0 and status["turns_in_flight"] == 0


# --- stored conversations ------------------------------------------------------------------------
async def stored_thread(
    client: ChatClient,
    thread_id: str,
    steps: int,
    timeout: float = WAIT_SECONDS,
    containing: str | None = None,
) -> dict:
    """The conversation as the sidebar loads it, once `steps` messages (and one whose output is
    `containing`, if given) are stored: writes are async, and notices are steps too."""
    for _ in range(int(timeout / 0.2)):
        response = await client.http("GET", f"/project/thread/{thread_id}")
        stored = (response.json().get("steps") or []) if response.status_code == 200 else []
        if len(stored) >= steps and (containing is None or any(s["output"] == containing for s in stored)):
            return response.json()
        await asyncio.sleep(0.2)
    raise AssertionError(f"thread {thread_id} did not reach {steps} stored steps")


async def thread_when(client: ChatClient, thread_id: str, holds: Any, timeout: float = WAIT_SECONDS) -> dict:
    """The stored conversation (as the sidebar loads it) once `holds(steps)` is true: writes are async."""
    steps: list = []
    for _ in range(int(timeout / 0.2)):
        response = await client.http("GET", f"/project/thread/{thread_id}")
        steps = response.json().get("steps") or [] if response.status_code == 200 else []
        if holds(steps):
            return response.json()
        await asyncio.sleep(0.2)
    raise AssertionError(f"never stored: {[(s['type'], s['output'][:30], s['createdAt']) for s in steps]}")


async def conversation_of(server: AppServer, who: tuple[str, str], text: str) -> tuple[ChatClient, str]:
    """A new stored conversation of `who` (a message and its answer); the client stays connected."""
    client = ChatClient(server.base_url, *who)
    await client.connect()
    assert (await client.ask(text)).final is not None
    thread_id = await client.conversation_id()
    await stored_thread(client, thread_id, steps=2, containing=text)
    return client, thread_id


def said(steps: list[dict], kind: str) -> list[str]:
    return [s["output"] for s in steps if s["type"] == kind]


def answers(steps: list[dict]) -> list[dict]:
    return [s for s in steps if s["type"] == "assistant_message" and "answer" in str(s.get("metadata"))]


# --- metrics -------------------------------------------------------------------------------------
def scrape(server: AppServer) -> dict[str, float]:
    """Every sample of the server's /metrics, by name with its labels (`name{label=value,...}`)."""
    with server.open("/metrics", 5) as response:
        text = response.read().decode()
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            values[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return values


def metric(server: AppServer, name: str, **labels: str) -> float:
    """The samples of `name` with these `labels` on the server's /metrics, summed."""
    with server.open("/metrics") as response:
        text = response.read().decode()
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


async def prompt_tokens_of(server: AppServer, client: ChatClient, text: str) -> float:
    """Prompt tokens the engine received for this one message (vLLM's own counter, from /metrics)."""
    before = await asyncio.to_thread(metric, server, "vllm:prompt_tokens_total")
    assert (await client.ask(text)).final is not None
    deadline = time.monotonic() + WAIT_SECONDS  # vLLM records a request's stats after its outputs
    while time.monotonic() < deadline:
        after = await asyncio.to_thread(metric, server, "vllm:prompt_tokens_total")
        if after > before:
            return after - before
        await asyncio.sleep(0.1)
    raise AssertionError("vLLM counted no prompt tokens for the request")
