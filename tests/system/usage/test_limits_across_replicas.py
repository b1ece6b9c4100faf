"""Per-person limits and sign-in failures counted across two app replicas on one PostgreSQL
(SHARED_LIMITS=auto): a person gets each limit once, not once per replica, and another person is not
affected. The replicas are the quota tests' (conftest.py), at the default USER_* and SIGN_IN_* limits:
2 answers at a time, 30 messages a minute, 5 failed sign-ins per account and address."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from harness.chat_client import ChatClient, SignInError, sign_in, user_message_payload
from harness.server import AppServer
from harness.waiting import until
from tests.system.helpers import collect_replies, refusals
from tests.system.usage.conftest import command

# two replicas: per commit, test_shared_limits_postgres.py in process
pytestmark = pytest.mark.topology

in_loop = pytest.mark.asyncio(loop_scope="module")
PASSWORD = "limits-password-1"
MESSAGES_PER_MINUTE, SIGN_IN_MAX_FAILURES = 30, 5  # the defaults


def new_person(database_url: str, name: str) -> str:
    who = f"{name}-{uuid.uuid4().hex[:6]}"
    command(database_url, "accounts", "add", who, stdin=PASSWORD + "\n")
    return who


async def page(server: AppServer, who: str) -> ChatClient:
    client = ChatClient(server.base_url, who, PASSWORD)
    await client.connect()
    return client


def shared_leases(server: AppServer) -> int:
    return server.status()["admission"]["shared_limits"]["leases_held"]


@in_loop
async def test_one_persons_answers_at_a_time_are_counted_across_replicas(
    replicas: tuple[AppServer, AppServer], database_url: str
) -> None:
    a, b = replicas
    who = await asyncio.to_thread(new_person, database_url, "lena")
    on_a, on_b, third_on_a, third_on_b = [await page(server, who) for server in (a, b, a, b)]
    other = await page(b, await asyncio.to_thread(new_person, database_url, "mona"))
    try:
        await on_a.start_long_answer()
        await on_b.start_long_answer()  # one answer on each replica: the person's 2 at a time
        assert shared_leases(a) == 1 and shared_leases(b) == 1
        for third in (third_on_a, third_on_b):  # alone, each replica would have let a second one in
            refused = await third.ask("And a third one?", timeout=30)
            assert refused.refused == "user_concurrent_turns", refused.final
            assert "You already have 2 answers in progress" in refused.final, refused.final
        mine = await other.send("My turn?")  # it may wait in B's line behind the long answer
        await until(lambda: mine.done.is_set() or shared_leases(b) == 2, "her turn started", 30, interval=0.1)
        assert mine.refused is None, "another person is not affected"
    finally:
        for client in (on_a, on_b, other):
            await client.stop()
        for client in (on_a, on_b, third_on_a, third_on_b, other):
            await client.close()
    for server in replicas:
        await server.poll(lambda s: s["turns_in_flight"] == 0, timeout=15)
        assert shared_leases(server) == 0, "an answer that ended gives its place back"


@in_loop
async def test_one_persons_messages_per_minute_are_counted_across_replicas(
    replicas: tuple[AppServer, AppServer], database_url: str
) -> None:
    who = await asyncio.to_thread(new_person, database_url, "otto")
    on_a, on_b = pages = [await page(server, who) for server in replicas]
    seen_a, seen_b = seen = [collect_replies(client) for client in pages]
    sent = MESSAGES_PER_MINUTE // 2 + 5  # each replica alone would take them all

    async def send(client: ChatClient, count: int) -> None:  # commands use no engine, and count all the same
        for _ in range(count):
            await client.sio.emit("client_message", user_message_payload("/key list"))

    def refused(replies: list[dict]) -> list[dict]:
        return refusals(replies, "user_messages_per_minute")

    await send(on_a, sent)
    await until(lambda: len(seen_a) >= sent, "each command is answered", 30, interval=0.1)
    await send(on_b, sent)
    await until(lambda: len(refused(seen_b)) == 2 * sent - MESSAGES_PER_MINUTE, "B refuses", 30, interval=0.1)
    await asyncio.sleep(1)
    assert not refused(seen_a) and len(refused(seen_b)) == 2 * sent - MESSAGES_PER_MINUTE, "the limit once"
    assert (
        f"the limit is {MESSAGES_PER_MINUTE} per minute. Please try again in ~"
        in refused(seen_b)[0]["output"]
    )
    await send(on_a, 1)
    await until(lambda: len(refused(seen_a)) == 1, "replica A refuses the next one too", interval=0.1)
    assert sum(len(refused(replies)) for replies in seen) == 2 * sent - MESSAGES_PER_MINUTE + 1
    other = await page(replicas[1], await asyncio.to_thread(new_person, database_url, "pia"))
    assert (await other.ask("My turn?", timeout=60)).refused is None, "another person is not affected"
    for client in (*pages, other):
        await client.close()


@in_loop
async def test_failed_sign_ins_spread_over_replicas_lock_the_account_out_at_the_limit_once(
    replicas: tuple[AppServer, AppServer], database_url: str
) -> None:
    who = await asyncio.to_thread(new_person, database_url, "rolf")
    for attempt in range(SIGN_IN_MAX_FAILURES):  # alternately: 3 on one replica, 2 on the other
        with pytest.raises(SignInError) as wrong:
            await sign_in(replicas[attempt % 2].base_url, who, "a-wrong-guess")
        assert wrong.value.status == 401, wrong.value
    for server in replicas:  # even the right password now waits, on either replica
        with pytest.raises(SignInError) as locked:
            await sign_in(server.base_url, who, PASSWORD)
        assert locked.value.status == 429 and "Too many failed sign-ins" in locked.value.detail, locked.value
        assert locked.value.retry_after and int(locked.value.retry_after) > 200
    other = await asyncio.to_thread(new_person, database_url, "sven")
    for server in replicas:
        assert await sign_in(server.base_url, other, PASSWORD), "another account signs in from there"
