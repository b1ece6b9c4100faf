"""The scale-out topology of deploy/topology.py, every part real, on loopback, tiny model: HAProxy ->
2 app replicas -> vLLM's router -> 2 `vllm serve`, one PostgreSQL. A conversation moves between
replicas and resumes from the database; the router keeps each conversation on one server and
admission reads those servers' load; a person's limits hold once for both replicas; a replica, a
vLLM server or the router going away costs one answer (kept as far as it came, with a clear
message), never the service (the balancer keeps every replica and their sockets while the router is
down); nothing is left behind."""

from __future__ import annotations

import asyncio
import signal
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from deploy.topology import Topology
from harness.chat_client import ChatClient, sign_in_sync
from harness.server import AppServer, VllmServer
from services.history.resume import CUT_ANSWER_NOTICE
from tests.conftest import ARTIFACTS, TINY_MAX_MODEL_LEN

# the whole deployment on one machine
pytestmark = pytest.mark.topology

NOT_AVAILABLE = "The model is not available right now"
CONVERSATIONS = 12  # all of them on one server by chance: 2 in 2**12
# deploy/haproxy.cfg's checks: three failures 2 s apart take a replica out (and cut its sockets)
BALANCER_OUT_SECONDS = 10
REPLICA_COOKIE = "CHAT_REPLICA"  # deploy/haproxy.cfg's sticky cookie; its values are app1, app2
in_loop = pytest.mark.asyncio(loop_scope="module")


def answered(server: VllmServer) -> float:
    """Requests the server has finished, from its own Prometheus metrics."""
    with urllib.request.urlopen(f"{server.url}/metrics", timeout=5) as response:
        lines = response.read().decode().splitlines()
    finished = [line for line in lines if line.startswith("vllm:request_success_total{")]
    return sum(float(line.rsplit(" ", 1)[1]) for line in finished)


@pytest.fixture(scope="module")
def topology(tiny_model_dir: Path) -> Iterator[Topology]:
    # One person (the admin) sends every message of the module, on both replicas, whose per-person
    # limits count together: USER_MESSAGES_PER_MINUTE's default (30) would refuse the routing checks.
    app_env = {"MAX_NEW_TOKENS": "16", "SIGN_IN_CHECK_SECONDS": "1", "USER_MESSAGES_PER_MINUTE": "600"}
    topology = Topology(tiny_model_dir, ARTIFACTS / "logs" / "topology", TINY_MAX_MODEL_LEN, app_env=app_env)
    topology.start()
    processes = [p for p in (topology.balancer, topology.router, *topology.engines, *topology.replicas)]
    tree = [psutil.Process(p.process.pid) for p in processes if p.process is not None]
    tree += [child for process in list(tree) for child in process.children(recursive=True)]
    try:
        yield topology
    finally:
        topology.stop()
    alive = [p for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"the topology left processes running: {alive}"
    assert topology.postgres is not None and not topology.postgres.root.exists(), "PostgreSQL's files"


@pytest.fixture(scope="module")
def admin_cookie(topology: Topology) -> str:
    cookie = sign_in_sync(topology.url, "admin", topology.admin_password)
    assert cookie
    return cookie


def on_replica(topology: Topology, cookie: str, replica: int) -> ChatClient:
    """A page signed in as `cookie` that the balancer sends to replica `replica` (1 or 2)."""
    return ChatClient(topology.url, cookie=f"{cookie}; {REPLICA_COOKIE}=app{replica}")


def sessions(replica: AppServer) -> int:
    return replica.status()["sessions"]


@in_loop
async def test_a_conversation_goes_on_from_the_other_replica(topology: Topology, admin_cookie: str) -> None:
    first = on_replica(topology, admin_cookie, 1)
    await first.connect()
    try:
        await topology.replicas[0].poll(lambda s: s["sessions"] >= 1, timeout=15)  # its chat start ran
        assert sessions(topology.replicas[1]) == 0
        assert (await first.ask("Remember the word lighthouse.")).final
        thread_id = await first.conversation_id()
    finally:
        await first.close()
    assert thread_id
    await asyncio.sleep(1)  # the answer is written as the turn ends
    reloaded = on_replica(topology, admin_cookie, 2)
    try:
        resumed = await reloaded.resume(thread_id)
        await topology.replicas[1].poll(lambda s: s["sessions"] >= 1, timeout=15)  # the other replica
        outputs = [step.get("output") for step in resumed.get("steps", [])]
        assert "Remember the word lighthouse." in outputs, outputs
        assert not any(CUT_ANSWER_NOTICE in n for n in reloaded.notices()), "the answer was complete"
        assert (await reloaded.ask("Which word?")).final
    finally:
        await reloaded.close()


@in_loop
async def test_each_conversation_stays_on_one_vllm_server_and_conversations_spread(
    topology: Topology, admin_cookie: str
) -> None:
    homes = []
    for index in range(CONVERSATIONS):
        client = on_replica(topology, admin_cookie, 1 + index % 2)
        await client.connect()
        try:
            before = [answered(s) for s in topology.engines]
            for turn in range(3):
                assert (await client.ask(f"Turn {turn} of conversation {index}?")).final
            served = [answered(s) - b for s, b in zip(topology.engines, before, strict=True)]
        finally:
            await client.close()
        assert sorted(served) == [0, 3], f"conversation {index} moved between servers: {served}"
        homes.append(served.index(3))
    assert set(homes) == {0, 1}, f"every conversation went to one server: {homes}"


@in_loop
async def test_admission_reads_the_load_of_the_servers_behind_the_router(
    topology: Topology, admin_cookie: str
) -> None:
    replica = topology.replicas[0]
    client = on_replica(topology, admin_cookie, 1)
    await client.connect()
    try:
        reply = await client.start_long_answer(1500)
        status = await replica.poll(lambda s: s["engine_load"]["running"] >= 1, timeout=15)
        assert status["engine_unfinished_requests"] == 1
        await client.stop()
        await asyncio.wait_for(reply.done.wait(), 30)
        await replica.poll(lambda s: s["engine_load"]["running"] == 0, timeout=15)
    finally:
        await client.close()


@in_loop
async def test_the_router_restarted_costs_the_turns_meanwhile_only(
    topology: Topology, admin_cookie: str
) -> None:
    assert topology.router is not None
    client = on_replica(topology, admin_cookie, 1)
    await client.connect()
    try:
        topology.router.stop()
        refused = await client.ask("Is the router there?", timeout=60)
        assert refused.final is not None and NOT_AVAILABLE in refused.final, refused.final
        await asyncio.sleep(BALANCER_OUT_SECONDS)  # a replica failing its checks would be out by now
        for path in ("/readyz", "/login"):  # the balancer still has both: pages and sign-in are served
            with await asyncio.to_thread(urllib.request.urlopen, topology.url + path, timeout=10) as page:
                assert page.status == 200, path
        still = await client.ask("Still no router?", timeout=60)
        assert still.final is not None and NOT_AVAILABLE in still.final, "the same socket, not cut"
        topology.router.start()
        again = await client.ask("And now?", timeout=60)
        assert again.final and NOT_AVAILABLE not in again.final, again.final
    finally:
        await client.close()


@in_loop
async def test_a_vllm_server_lost_mid_answer_keeps_the_partial_answer_and_the_next_turn_works(
    topology: Topology, admin_cookie: str
) -> None:
    client = on_replica(topology, admin_cookie, 2)
    await client.connect()
    try:
        before = [answered(s) for s in topology.engines]
        assert (await client.ask("Where do I live?")).final
        home = next(i for i, s in enumerate(topology.engines) if answered(s) > before[i])
        reply = await client.start_long_answer(3000)
        await client.wait_first_token(reply)
        topology.engines[home].stop(signal.SIGKILL)  # gone for good: the next tests need one server
        await asyncio.wait_for(reply.done.wait(), 60)
        assert reply.final is not None and NOT_AVAILABLE in reply.final, reply.final
        assert reply.streamed_text and reply.final.startswith(reply.streamed_text), "the partial answer stays"
        await client.update_settings(max_new_tokens=16)  # the long answer's budget would run minutes
        again = await client.ask("Still there?", timeout=60)
        assert again.final and NOT_AVAILABLE not in again.final, again.final
    finally:
        await client.close()
    status = topology.replicas[1].status()
    assert status["engine_unfinished_requests"] == 0 and status["turns_in_flight"] == 0


@in_loop
async def test_a_persons_answers_at_a_time_are_counted_across_replicas(
    topology: Topology, admin_cookie: str
) -> None:
    """USER_MAX_CONCURRENT_TURNS (2 by default) holds once for both replicas: counted in PostgreSQL."""
    running = [on_replica(topology, admin_cookie, replica) for replica in (1, 2)]
    third = on_replica(topology, admin_cookie, 1)
    for client in (*running, third):
        await client.connect()
    try:
        for client in running:  # one on each replica: alone, replica 1 would let a second one in
            await client.start_long_answer(3000)
        refused = await third.ask("And a third one?", timeout=30)
        assert refused.refused == "user_concurrent_turns", refused.final
        for replica in topology.replicas:  # their waiting lines are shared through PostgreSQL too
            line = replica.status()["admission"]["shared_line"]
            assert line["exchanges_total"] > 0 and line["others_waiting"] == 0, line
    finally:
        for client in running:
            await client.stop()
        for client in (*running, third):
            await client.close()
    for replica in topology.replicas:
        await replica.poll(lambda s: s["turns_in_flight"] == 0, timeout=15)


@in_loop
async def test_a_replica_killed_mid_answer_sends_the_page_to_the_other_which_says_the_answer_was_cut(
    topology: Topology, admin_cookie: str
) -> None:
    client = on_replica(topology, admin_cookie, 1)
    await client.connect()
    try:
        assert (await client.ask("Before the crash.")).final
        thread_id = await client.conversation_id()
        reply = await client.start_long_answer(3000)
        await client.wait_first_token(reply)
        topology.replicas[0].stop(signal.SIGKILL)  # the last test: replica 1 stays down
    finally:
        await client.drop()
    reloaded = on_replica(topology, admin_cookie, 1)  # the page still holds replica 1's cookie
    try:
        resumed = await reloaded.resume(thread_id, timeout=60)
        outputs = [step.get("output") for step in resumed.get("steps", [])]
        assert "Before the crash." in outputs, outputs
        await asyncio.sleep(1)
        assert any(CUT_ANSWER_NOTICE in n for n in reloaded.notices()), reloaded.notices()
        await reloaded.update_settings(max_new_tokens=16)  # the resumed conversation kept the long budget
        again = await reloaded.ask("After the crash?", timeout=60)
        assert again.final and NOT_AVAILABLE not in again.final, again.final
    finally:
        await reloaded.close()
