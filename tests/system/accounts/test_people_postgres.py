"""Two app replicas on one PostgreSQL (Debian's, a throwaway cluster): a conversation started on one
resumes on the other, and the database going away mid-session degrades chat cleanly, then recovers."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.chat_client import ChatClient
from harness.postgres import PostgresCluster
from harness.server import AppServer
from tests.conftest import ARTIFACTS, TINY_MAX_MODEL_LEN, server_env
from tests.system.conftest import ADMIN
from tests.system.helpers import LONG_TURN_WORDS, prompt_tokens_of, stored_thread

# two replicas on PostgreSQL: per commit, test_history.py and test_shared_limits_postgres.py in process
pytestmark = pytest.mark.topology

in_loop = pytest.mark.asyncio(loop_scope="module")


@pytest.fixture(scope="module")
def replicas(tiny_model_dir: Path, postgres: PostgresCluster) -> Iterator[tuple[AppServer, AppServer]]:
    """Two servers, each with its own folder, sharing the database and the sign-in secret."""
    env = server_env(
        MODEL=tiny_model_dir, MAX_MODEL_LEN=TINY_MAX_MODEL_LEN, MAX_NUM_BATCHED_TOKENS=4096,
        MAX_NEW_TOKENS=16, AUTH_MODE="password", ADMIN_USERNAME=ADMIN[0], ADMIN_PASSWORD=ADMIN[1],
        DATABASE_URL=postgres.create_database("replicas"), CHAINLIT_AUTH_SECRET=secrets.token_urlsafe(48),
        DATABASE_TIMEOUT_SECONDS=1, HISTORY_RETRY_SECONDS=1,
    )  # fmt: skip
    servers: list[AppServer] = []
    try:
        for name in ("a", "b"):
            servers.append(AppServer(dict(env), ARTIFACTS / "logs" / f"replica-{name}.log").start())
        yield servers[0], servers[1]
    finally:
        for server in servers:
            server.stop()


@in_loop
async def test_a_conversation_started_on_one_replica_resumes_on_the_other(
    replicas: tuple[AppServer, AppServer],
) -> None:
    first, second = replicas
    on_a = ChatClient(first.base_url, *ADMIN)
    await on_a.connect()
    long_turn = "Note this. " + " ".join(f"fact{i}" for i in range(LONG_TURN_WORDS))
    assert (await on_a.ask(long_turn)).final is not None
    thread_id = on_a.thread_id
    assert thread_id
    await stored_thread(on_a, thread_id, steps=2)
    await on_a.leave()
    on_b = ChatClient(second.base_url, cookie=on_a.cookie)  # the same browser, sent to the other replica
    thread = await on_b.resume(thread_id)
    assert any(s["output"] == long_turn for s in thread["steps"])
    tokens = await prompt_tokens_of(second, on_b, "What did I note?")
    assert tokens > LONG_TURN_WORDS, "replica B's model got the turns made on replica A"
    await on_b.close()


@in_loop
async def test_postgres_going_away_mid_session_degrades_and_recovers(
    replicas: tuple[AppServer, AppServer], postgres: PostgresCluster
) -> None:
    server = replicas[0]
    client = ChatClient(server.base_url, *ADMIN)
    await client.connect()
    assert (await client.ask("Before the outage.")).final is not None
    thread_id = client.thread_id
    await stored_thread(client, thread_id, steps=2)  # type: ignore[arg-type]
    postgres.stop()
    try:
        assert (await client.ask("During the outage.")).final, "chat keeps working"
        await server.poll(lambda s: s["history"]["available"] is False, timeout=10)
        assert (await client.ask("Still during the outage.")).final
        assert any("not being saved" in text for text in client.notices()), client.notices()
        assert (await server.astatus())["history"]["reason"] == "unreachable"
    finally:
        postgres.start()
    await server.poll(lambda s: s["history"]["available"], timeout=20)
    assert (await client.ask("After the outage.")).final is not None
    assert any("saved again" in text for text in client.notices())
    thread = await stored_thread(client, thread_id, steps=4, containing="After the outage.")  # type: ignore[arg-type]
    outputs = [s["output"] for s in thread["steps"]]
    assert "Before the outage." in outputs and "After the outage." in outputs
    await asyncio.sleep(0)
    await client.close()
