"""Overload on a real server (tiny model): chat before documents, a bounded queue that tells people
where they stand and refuses clearly, per-user limits, session pressure that never kills a running turn.

One server for the module, small on purpose: two requests run at once (MAX_NUM_SEQS=2; the tiny model
keeps any reading pace, so the limit is the batch), one chat turn may wait (however long), four
sessions at most.
Each client is a person of its own (its own X-Forwarded-For address) unless a test says otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Page
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from harness.browser import ANSWER, open_chat, send_message
from harness.chat_client import ChatClient, Reply
from harness.documents import long_document
from harness.server import AppServer
from tests.conftest import ARTIFACTS, TINY_MAX_MODEL_LEN, TINY_OPS_TOKEN, server_env
from tests.system.helpers import scrape

# a small server of its own: per commit, tests/unit/test_admission.py (the line, its refusals, a waiting
# turn told its place, per-person limits) and the engine's turns in tests/unit/test_rewinds.py
pytestmark = pytest.mark.long

aio = pytest.mark.asyncio(loop_scope="module")

LONG_ANSWER_TOKENS = 3000
TOKENS_PER_MINUTE = 400


@pytest.fixture(scope="module")
def small_server(tiny_model_dir: Path) -> Iterator[AppServer]:
    env = server_env(
        MODEL=tiny_model_dir, MAX_MODEL_LEN=TINY_MAX_MODEL_LEN, MAX_NUM_BATCHED_TOKENS=4096, MAX_NUM_SEQS=2,
        MAX_NEW_TOKENS=48, MAX_SESSIONS=4, ADMISSION_QUEUE_MAX=1, ADMISSION_MAX_WAIT_SECONDS=600,
        USER_MAX_CONCURRENT_TURNS=1,
        USER_TOKENS_PER_MINUTE=TOKENS_PER_MINUTE, USER_DOCUMENTS_PER_HOUR=1, SUMMARY_CHUNK_TOKENS=1024,
        SUMMARY_MAX_TOKENS=400, OPS_TOKEN=TINY_OPS_TOKEN,
        LOOP_GUARD_MIN_TOKENS=0,  # the random tiny model repeats itself: long answers must hold their slots
    )  # fmt: skip
    server = AppServer(env, ARTIFACTS / "logs" / "overload-server.log").start()
    yield server
    leftovers = server.stop()
    assert not leftovers, f"engine processes outlived the server: {leftovers}"


@contextlib.asynccontextmanager
async def clients(server: AppServer, count: int, address: str | None = None):
    """`count` connected clients (one person each, or all `address`), closed and forgotten afterwards."""
    connected = [ChatClient(server.base_url, address=address) for _ in range(count)]
    await asyncio.gather(*(client.connect() for client in connected))
    try:
        yield connected
    finally:
        closed = await asyncio.gather(*(client.close() for client in connected), return_exceptions=True)
        try:
            await server.poll(lambda s: s["sessions"] == 0 and s["engine_unfinished_requests"] == 0, 10)
        except AssertionError as error:  # what the server did with the closes, for the next reader
            lines = server.log_path.read_text(errors="replace").splitlines()
            sessions = [line for line in lines if "session" in line][-30:]
            raise AssertionError(f"{error}\nclose() results: {closed}\n" + "\n".join(sessions)) from None


async def settled_status(server: AppServer, predicate, timeout: float = 10) -> dict:
    return await server.poll(predicate, timeout=timeout, interval=0.05)


def waiting(status: dict) -> int:
    return status["admission"]["waiting"]


@aio
async def test_two_run_at_once_by_measured_capacity(small_server: AppServer) -> None:
    status = await small_server.astatus()
    admission = status["admission"]
    assert admission["enabled"] and admission["running_limit"] == 2
    assert admission["seconds_per_token_by_batch"], "the warm-up measured decode speed per batch size"
    assert status["warm_up"]["seconds"] > 0 and status["warm_up"]["decode_seconds_per_token"]


@aio
async def test_chat_turn_behind_eight_document_parts_gets_its_first_token_first(
    small_server: AppServer,
) -> None:
    async with clients(small_server, 2) as (reader, chatter):
        parts_done: dict[int, float] = {}  # parts summarized -> when the progress first said so
        parts_total = [0]

        async def watch_progress() -> None:
            while True:
                for message in list(reader.messages.values()):
                    output = message.get("output") or ""
                    if found := re.search(r"(\d+) of (\d+) parts summarized", output):
                        parts_done.setdefault(int(found.group(1)), time.monotonic())
                    if found := re.search(r"(?:of|in) (\d+) parts", output):
                        parts_total[0] = max(parts_total[0], int(found.group(1)))
                await asyncio.sleep(0.005)

        watcher = asyncio.create_task(watch_progress())
        try:
            file_id = await reader.upload("report.txt", long_document(8000, seed=3).encode(), "text/plain")
            summary = await reader.send("Summarize this.", [file_id])
            # One part runs (DOCUMENT_SLOT_SHARE of the limit of 2, at least one), 7 wait.
            status = await settled_status(small_server, lambda s: waiting(s) >= 6)
            assert status["admission"]["running"].get("document") == 1, "parts hold only their share"
            chat = await chatter.ask("A quick question while the summary runs?", timeout=60)
            assert chat.final and chat.refused is None
            await asyncio.wait_for(summary.done.wait(), 180)
        finally:
            watcher.cancel()
        assert parts_total[0] >= 8, f"the document was summarized in {parts_total[0]} parts"
        assert chat.first_token_at is not None
        third_part_done = min(at for done, at in parts_done.items() if done >= 3)
        assert chat.first_token_at < third_part_done, "the chat turn went ahead of the waiting document parts"
        assert summary.final and summary.refused is None, "and the summary still finished"


async def start_long(client: ChatClient) -> Reply:
    return await client.start_long_answer(LONG_ANSWER_TOKENS)


@aio
async def test_a_full_queue_refuses_at_once_and_the_service_keeps_serving(small_server: AppServer) -> None:
    async with clients(small_server, 4) as (first, second, third, fourth):
        running = [await start_long(first), await start_long(second)]
        await third.update_settings(max_new_tokens=16)
        queued = await third.send("I will wait for my turn.")
        await settled_status(small_server, lambda s: waiting(s) == 1)
        await asyncio.sleep(2.5)  # long enough for the place in line to be updated
        code, health = await asyncio.to_thread(small_server.healthz)
        assert (code, health["status"]) == (200, "overloaded"), "overloaded is not down"
        sent = time.monotonic()
        refused = await fourth.ask("And me?", timeout=10)
        assert refused.refused == "queue_full" and refused.done_at - sent < 1.0, "told at once"
        assert re.search(
            r"busy: (1 request is|\d+ requests are) waiting ahead of yours\. "
            r"Please try again in ~\d+ (s|min)",
            refused.final,
        )
        sent = time.monotonic()
        early = await fourth.ask("Now?", timeout=10)  # resent at once: the same answer, no new work
        assert early.refused == "resent_early" and early.done_at - sent < 1.0, early.final
        assert "This one was not sent" in early.final
        assert len(queued.status) >= 2, "the waiting turn saw its place, updated"
        assert "you are next in line" in queued.status[-1][1]
        await first.stop()
        await asyncio.wait_for(queued.done.wait(), 30)
        assert queued.final and queued.refused is None, "the waiting turn was answered"
        assert queued.status_removed_at is not None and queued.status_removed_at <= queued.first_token_at
        assert all(when < queued.first_token_at for when, _ in queued.status), "replaced by the answer"
        await second.stop()
        await fourth.update_settings(max_new_tokens=16)
        again = await fourth.ask("Now?", timeout=30)
        assert again.final and again.refused is None, "the service keeps serving"
        assert all(reply.first_token_at for reply in running)
    metrics = await asyncio.to_thread(scrape, small_server)
    assert metrics["chat_admission_refusals_total{reason=queue_full}"] >= 1
    assert metrics["chat_admission_refusals_total{reason=resent_early}"] >= 1


@aio
async def test_one_person_gets_one_answer_at_a_time_across_tabs(small_server: AppServer) -> None:
    async with clients(small_server, 2, address="10.200.0.1") as (tab, other_tab):
        await start_long(tab)
        refused = await other_tab.ask("From my other tab?", timeout=10)
        assert refused.refused == "user_concurrent_turns"
        assert "limit is 1 at a time" in refused.final and "try again when one has finished" in refused.final
        await tab.stop()
        await small_server.poll(lambda s: s["turns_in_flight"] == 0, timeout=5)
        await other_tab.update_settings(max_new_tokens=16)
        assert (await other_tab.ask("Now?", timeout=30)).refused is None, "fine once the first one ended"


@aio
async def test_tokens_per_minute_are_limited_with_a_time_to_retry(small_server: AppServer) -> None:
    async with clients(small_server, 1) as (client,):
        await client.update_settings(max_new_tokens=200, temperature=1.0)
        for _ in range(15):
            reply = await client.ask("Tell me a story.", timeout=60)
            if reply.refused:
                break
        assert reply.refused == "user_tokens_per_minute", "the limit was reached within 15 turns"
        assert re.search(r"Please try again in ~\d+ s\.", reply.final), reply.final


@aio
async def test_documents_per_hour_are_limited_with_a_time_to_retry(small_server: AppServer) -> None:
    async with clients(small_server, 1) as (client,):
        await client.update_settings(max_new_tokens=16)
        first = await client.upload("a.txt", long_document(200, seed=1).encode(), "text/plain")
        assert (await client.ask("Summarize.", file_ids=[first], timeout=60)).refused is None
        second = await client.upload("b.txt", long_document(200, seed=2).encode(), "text/plain")
        reply = await client.ask("Summarize this one too.", file_ids=[second], timeout=10)
        assert reply.refused == "user_documents_per_hour"
        assert re.search(r"limit is 1 per hour\. Please try again in ~(59|60) min", reply.final), reply.final
        assert (await client.ask("But chat still works?", timeout=30)).refused is None


@aio
async def test_session_pressure_evicts_idle_sessions_never_a_running_turn(small_server: AppServer) -> None:
    async with clients(small_server, 3) as (runner_1, runner_2, _idle):
        running = [await start_long(runner_1), await start_long(runner_2)]
        reader = ChatClient(small_server.base_url)
        await reader.connect()
        document = await reader.upload("long.txt", long_document(8000, seed=5).encode(), "text/plain")
        summary = await reader.send("Summarize.", [document])  # its parts wait: a busy session
        await settled_status(small_server, lambda s: waiting(s) >= 1 and s["sessions"] == 4)
        newcomer = ChatClient(small_server.base_url)
        await newcomer.connect()  # takes the idle session's place
        status = await settled_status(small_server, lambda s: s["sessions_dropped_total"]["evicted"] == 1)
        assert status["sessions"] == 4
        await newcomer.update_settings(max_new_tokens=LONG_ANSWER_TOKENS, temperature=1.0)
        queued = await newcomer.send("I will wait in line.")  # now every session is busy
        await settled_status(small_server, lambda s: s["turns_in_flight"] == 4)
        refused_client = ChatClient(small_server.base_url)
        await refused_client.connect()
        await settled_status(small_server, lambda s: s["sessions_refused_total"] == 1)
        told = [m for m in refused_client.messages.values() if (m.get("metadata") or {}).get("refused")]
        assert told and "all of them are answering right now" in told[0]["output"]
        before = [len(reply.streamed) for reply in running]
        await asyncio.sleep(1.0)
        assert all(len(r.streamed) > b for r, b in zip(running, before, strict=True)), "still streaming"
        assert not any(reply.done.is_set() for reply in (*running, summary, queued)), "no turn was cut"
        assert (await small_server.astatus())["sessions_dropped_total"]["evicted"] == 1, "only the idle one"
        for client in (runner_1, runner_2, reader, newcomer):
            await client.stop()
        for client in (reader, newcomer, refused_client):
            await client.close()


class LoopThread:
    """An event loop in a thread of its own, for async clients next to a sync (browser) test."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coroutine, timeout: float = 60):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


def test_a_person_in_the_browser_sees_their_place_then_the_answer(
    small_server: AppServer, page: Page
) -> None:
    background = LoopThread()
    holders = [ChatClient(small_server.base_url) for _ in range(2)]
    try:
        # The page first (its load is the slow part), then both running slots taken by long answers,
        # then the message at once: the random tiny model may end a sampled answer on its own, so the
        # holders' answers must not have to outlive the page's load.
        open_chat(page, small_server.base_url)
        for client in holders:
            background.run(client.connect())
            background.run(start_long(client))
        send_message(page, "Is it my turn yet?")
        status = page.get_by_text("The service is busy")
        try:
            status.first.wait_for(timeout=10_000)
        except PlaywrightTimeout:
            running = small_server.status()["turns_in_flight"]
            message = f"no place in line shown; turns running: {running} (the holders' two, then)"
            raise AssertionError(message) from None
        assert "you are next in line" in status.first.inner_text()
        screenshots = ARTIFACTS / "screenshots"
        screenshots.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(screenshots / "waiting.png"), full_page=True)
        background.run(holders[0].stop())
        page.locator(ANSWER).filter(has_not_text="The service is busy").last.wait_for(timeout=30_000)
        status.first.wait_for(state="detached", timeout=30_000)
        page.screenshot(path=str(screenshots / "waited-answer.png"), full_page=True)
    finally:
        for client in holders:
            with contextlib.suppress(Exception):
                background.run(client.stop())
                background.run(client.close())
        background.close()
