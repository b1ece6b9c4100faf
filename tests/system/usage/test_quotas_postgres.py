"""Token budgets on two app replicas sharing one PostgreSQL (Debian's, a throwaway cluster), with a
budget that holds one long turn but not two: chat and the API are refused with what is left and
when it resets, an administrator raising the budget lets the person go on, the replicas add their
usage up and give a person the budget once (not once each, within the refresh bound), and usage
survives a replica's restart.

These two servers (conftest.py) serve every quota test: a budget this small would break the shared
servers' tests. Replica B writes usage only every hour, so what it counted reaches the database at
its shutdown; this module's last test stops it, so it runs after the others that use them."""

from __future__ import annotations

import asyncio
import csv
import io
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from harness.chat_client import ChatClient
from harness.server import AppServer
from tests.conftest import ARTIFACTS
from tests.system.usage.conftest import DAY_BUDGET, FLUSH_SECONDS, REFRESH_SECONDS, command

# replicas and a restart: per commit, tests/unit/test_usage.py and the admin page's budget
pytestmark = pytest.mark.topology

in_loop = pytest.mark.asyncio(loop_scope="module")
SHARED_WITHIN_SECONDS = FLUSH_SECONDS + REFRESH_SECONDS + 3  # the stated bound, plus a turn's time
# ~170 tokens with the chat template: one fits DAY_BUDGET, a second does not (each request's worst case
# must fit what is left, services/admission/grants.py)
LONG = "Remember these words: " + " ".join(f"word{i}" for i in range(50))
PASSWORD = "quota-password-1"
ANSWERED: dict[str, int] = {}  # API calls answered, by replica (test_replicas_add_usage_up_...)


def person(database_url: str, name: str) -> tuple[str, str]:
    command(database_url, "accounts", "add", name, stdin=PASSWORD + "\n")
    return name, PASSWORD


def usage_of(database_url: str, name: str) -> dict[str, int]:
    """Today's stored row of `name`: counter -> value (empty when none)."""
    rows = list(csv.DictReader(io.StringIO(command(database_url, "usage", "show", "--user", name, "--csv"))))
    return {key: int(value) for key, value in rows[0].items() if key not in ("person", "day")} if rows else {}


def api_call(server: AppServer, key: str, text: str) -> httpx.Response:
    body = {"model": "tiny-llama", "messages": [{"role": "user", "content": text}], "max_tokens": 4}
    headers = {"Authorization": f"Bearer {key}"}
    return httpx.post(f"{server.base_url}/v1/chat/completions", json=body, headers=headers, timeout=60)


def seconds_to_midnight() -> float:
    now = datetime.now(UTC)
    return (datetime(now.year, now.month, now.day, tzinfo=UTC) + timedelta(days=1) - now).total_seconds()


async def poll(check, timeout: float) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "not within the bound"
        await asyncio.sleep(0.2)


@in_loop
async def test_chat_over_budget_is_refused_with_the_reset_and_a_raised_budget_lets_it_go_on(
    replicas: tuple[AppServer, AppServer], database_url: str
) -> None:
    server = replicas[0]
    client = ChatClient(server.base_url, *person(database_url, "quinn"))
    await client.connect()
    first = await client.ask(LONG)
    assert first.final and not first.refused, "under budget: answered"
    refused = await client.ask(LONG)
    assert refused.refused == "quota_day", refused.final
    assert "needs up to" in refused.final and "tokens for today (UTC) are left" in refused.final
    assert "resets at 00:00 UTC" in refused.final
    assert f"of your {DAY_BUDGET} tokens" in refused.final
    shown = command(database_url, "usage", "quota", "set", "quinn", "--day", "100000")
    assert "100,000 tokens (own budget" in shown
    await asyncio.sleep(REFRESH_SECONDS + 1)  # the replica re-reads budgets this often
    again = await client.ask("And now?")
    assert again.final and not again.refused, again.final
    await client.send("/quota")
    await asyncio.sleep(1)
    quota = [d["output"] for name, d in client.events if name == "new_message" and d.get("name") == "quota"]
    assert quota and "of 100,000 tokens used" in quota[-1], quota
    await client.close()
    await poll(lambda: usage_of(database_url, "quinn").get("turns") == 2, timeout=10)
    stored = usage_of(database_url, "quinn")
    assert stored["refusals"] == 1 and stored["prompt_tokens"] > 200 and stored["answer_tokens"] > 0, stored


@in_loop
async def test_api_over_budget_gets_429_in_openais_shape_with_retry_after(
    replicas: tuple[AppServer, AppServer], database_url: str
) -> None:
    server = replicas[0]
    person(database_url, "rita")
    key = command(database_url, "accounts", "key", "create", "rita").split()[0]
    assert api_call(server, key, LONG).status_code == 200
    response = api_call(server, key, LONG)
    assert response.status_code == 429
    error = response.json()["error"]
    assert error["code"] == "quota_day" and "resets at 00:00 UTC" in error["message"], error
    retry = int(response.headers["retry-after"])
    assert abs(retry - seconds_to_midnight()) < 60, (retry, seconds_to_midnight())
    await poll(lambda: usage_of(database_url, "rita").get("refusals") == 1, timeout=10)
    stored = usage_of(database_url, "rita")
    assert stored["api_calls"] == 1 and stored["turns"] == 0 and stored["prompt_tokens"] > 100, stored


@in_loop
async def test_replicas_add_usage_up_and_give_the_budget_once(
    replicas: tuple[AppServer, AppServer], database_url: str
) -> None:
    a, b = replicas
    person(database_url, "sam")
    key = command(database_url, "accounts", "key", "create", "sam").split()[0]
    assert api_call(b, key, "Hi").status_code == 200  # replica B now holds sam's running totals
    assert api_call(a, key, LONG).status_code == 200  # replica A leaves too little for another
    assert api_call(a, key, LONG).status_code == 429
    ANSWERED.update(a=1, b=1)
    started = asyncio.get_running_loop().time()
    # B, which has not seen A's usage yet, may answer once more: then its own count, or A's usage
    # learned within the bound, leaves too little
    while (response := api_call(b, key, LONG)).status_code == 200:
        assert asyncio.get_running_loop().time() - started < SHARED_WITHIN_SECONDS, "B gave the budget again"
        ANSWERED["b"] += 1
        await asyncio.sleep(0.5)
    assert response.status_code == 429 and response.json()["error"]["code"] == "quota_day"
    assert ANSWERED["b"] <= 2, "B let more than one long request past what it knew was left"
    await poll(
        lambda: usage_of(database_url, "sam").get("api_calls") == 1, timeout=10
    )  # A's; B's at its stop


@in_loop
async def test_usage_survives_a_restart_and_the_budget_still_holds(
    replicas: tuple[AppServer, AppServer], database_url: str
) -> None:
    b = replicas[1]
    client = ChatClient(b.base_url, *person(database_url, "tess"))
    await client.connect()
    assert (await client.ask(LONG)).final
    await client.close()
    assert usage_of(database_url, "tess") == {}, "replica B writes every minute: not yet"
    b.stop()  # SIGTERM: what B counted is written at shutdown
    stored = usage_of(database_url, "tess")
    assert stored.get("turns") == 1, stored
    assert 100 < stored["prompt_tokens"] + stored["answer_tokens"] <= DAY_BUDGET, "a turn stays within it"
    if ANSWERED:  # both replicas' counts of one person on one day, added up in one row
        assert usage_of(database_url, "sam")["api_calls"] == ANSWERED["a"] + ANSWERED["b"]
    own_folders = ("CHAINLIT_APP_ROOT", "DATA_DIR")  # removed at its stop: the new process gets its own
    env = {key: value for key, value in b.env.items() if key not in own_folders}
    restarted = AppServer(env, ARTIFACTS / "logs" / "usage-b-restarted.log").start(timeout=900)
    try:
        client = ChatClient(restarted.base_url, "tess", PASSWORD)
        await client.connect()
        refused = await client.ask(LONG)
        assert refused.refused == "quota_day", "the restarted replica reads her usage back"
        await client.close()
    finally:
        assert not restarted.stop(), "engine processes outlived the server"
