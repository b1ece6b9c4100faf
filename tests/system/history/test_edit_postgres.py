"""Edit on PostgreSQL (Debian's, a throwaway cluster): the stored conversation loses the old branch
(its answers and their feedback) and keeps the edited message in place, as on SQLite."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.chat_client import ChatClient
from harness.postgres import PostgresCluster
from harness.server import AppServer
from tests.conftest import ARTIFACTS, TINY_MAX_MODEL_LEN, server_env
from tests.system.conftest import ADMIN
from tests.system.helpers import answers, done, said, thread_when

# a server on PostgreSQL: per commit, chat/test_edit_regenerate.py on SQLite and test_history.py on both
pytestmark = pytest.mark.long

in_loop = pytest.mark.asyncio(loop_scope="module")


@pytest.fixture(scope="module")
def postgres_server(tiny_model_dir: Path, postgres: PostgresCluster) -> Iterator[AppServer]:
    """The one server of this module: conversations in PostgreSQL (none of the shared servers is)."""
    env = server_env(
        MODEL=tiny_model_dir, MAX_MODEL_LEN=TINY_MAX_MODEL_LEN, MAX_NUM_BATCHED_TOKENS=4096,
        MAX_NEW_TOKENS=8, AUTH_MODE="password", ADMIN_USERNAME=ADMIN[0], ADMIN_PASSWORD=ADMIN[1],
        DATABASE_URL=postgres.create_database("edits"), CHAINLIT_AUTH_SECRET=secrets.token_urlsafe(48),
    )  # fmt: skip
    server = AppServer(env, ARTIFACTS / "logs" / "edit-postgres.log").start()
    try:
        yield server
    finally:
        server.stop()


@in_loop
async def test_an_edit_removes_the_old_branch_from_postgresql(postgres_server: AppServer) -> None:
    client = ChatClient(postgres_server.base_url, *ADMIN)
    await client.connect()
    first = await client.ask("Name a river.")
    second = await client.ask("Name a mountain.")
    thread_id = await client.conversation_id()
    assert first.message_id and second.message_id
    await thread_when(client, thread_id, lambda steps: len(answers(steps)) == 2)
    feedback = {"sessionId": client.session_id, "feedback": {"forId": second.message_id, "value": 0}}
    assert (await client.http("PUT", "/feedback", json=feedback)).status_code == 200
    edited = await done(await client.edit(client.sent[0]["id"], "Name a lake."))
    thread = await thread_when(
        client,
        thread_id,
        lambda steps: said(steps, "user_message") == ["Name a lake."] and len(answers(steps)) == 1,
    )
    assert [s["id"] for s in answers(thread["steps"])] == [edited.message_id]
    assert [s["id"] for s in thread["steps"] if s["type"] == "user_message"] == [client.sent[0]["id"]]
    assert not any(s.get("feedback") for s in thread["steps"]), "the old answers' feedback went with them"
    await client.close()
