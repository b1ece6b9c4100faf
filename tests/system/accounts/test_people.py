"""Sign-in and stored conversations on a real server (tiny model, SQLite, password sign-in), over
Chainlit's socket.io protocol and its REST routes, as the page uses them."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from playwright.sync_api import sync_playwright

from harness.browser import (
    ANSWER,
    USER_STEP,
    browser_page,
    send_message,
    sign_in_on_page,
    stored_messages,
    wait_for_session,
)
from harness.chat_client import ChatClient, SignInError, sign_in
from harness.server import ROOT, AppServer
from harness.waiting import WAIT_SECONDS, until_sync
from services.config import Settings
from tests.conftest import ARTIFACTS
from tests.system.conftest import ADMIN, ALICE, BOB, accounts
from tests.system.helpers import LONG_TURN_WORDS, data_dir, metric, prompt_tokens_of, signed_in, stored_thread

in_loop = pytest.mark.asyncio(loop_scope="module")

FIRST_MESSAGE = "A conversation worth keeping."  # the browser test's, found again after a reload


@pytest.fixture(scope="module")
def people_server(password_server: AppServer) -> AppServer:
    """The password server (tests/system/conftest.py), shared with the attack suite."""
    return password_server


def settings_of(server: AppServer) -> Settings:
    return Settings.from_env(server.env)


@in_loop
async def test_a_wrong_password_is_refused_and_repeated_failures_wait(people_server: AppServer) -> None:
    accounts(data_dir(people_server), "add", "victim", stdin="victims-password\n")
    with pytest.raises(SignInError) as wrong:
        await sign_in(people_server.base_url, "victim", "not the password")
    assert wrong.value.status == 401
    for _ in range(settings_of(people_server).sign_in_max_failures - 1):
        with pytest.raises(SignInError):
            await sign_in(people_server.base_url, "victim", "still wrong")
    with pytest.raises(SignInError) as waiting:
        await sign_in(people_server.base_url, "victim", "victims-password")
    assert waiting.value.status == 429 and "Too many failed sign-ins" in waiting.value.detail
    assert waiting.value.retry_after and int(waiting.value.retry_after) > 0
    assert await sign_in(people_server.base_url, *ALICE), "other accounts are not affected"


@in_loop
async def test_a_resumed_conversation_reaches_the_model_with_its_settings(people_server: AppServer) -> None:
    alice = await signed_in(people_server, ALICE)
    question = "Here is a long story. " + " ".join(f"word{i}" for i in range(LONG_TURN_WORDS))
    await alice.update_settings(temperature=0.55, system_prompt="Answer in one line.")
    assert (await alice.ask(question)).final is not None
    assert (await alice.ask("Thanks.")).final is not None
    thread_id = alice.thread_id
    assert thread_id
    await stored_thread(alice, thread_id, steps=4)
    await alice.leave()  # the page reloads: Chainlit stores the chat settings with the conversation
    fresh = await signed_in(people_server, ALICE)
    fresh_tokens = await prompt_tokens_of(people_server, fresh, "What did I tell you?")
    await fresh.close()
    reloaded = ChatClient(people_server.base_url, cookie=alice.cookie)
    thread = await reloaded.resume(thread_id)
    assert [s["output"] for s in thread["steps"] if s["type"] == "user_message"] == [question, "Thanks."]
    initial = {w["id"]: w.get("initial") for w in reloaded.settings_widgets}
    assert initial["temperature"] == 0.55 and initial["system_prompt"] == "Answer in one line."
    resumed_tokens = await prompt_tokens_of(people_server, reloaded, "What did I tell you?")
    assert resumed_tokens > fresh_tokens + LONG_TURN_WORDS, (resumed_tokens, fresh_tokens)
    await reloaded.close()


@in_loop
async def test_a_reconnecting_page_continues_with_what_the_model_knew(people_server: AppServer) -> None:
    page = await signed_in(people_server, ALICE)
    assert (
        await page.ask("Remember: " + " ".join(f"item{i}" for i in range(LONG_TURN_WORDS)))
    ).final is not None
    await page.drop()  # a network blip: the page keeps its session id and reconnects
    status = await people_server.poll(lambda s: s["sessions_awaiting_reconnect"] >= 1, timeout=WAIT_SECONDS)
    assert status["turns_in_flight"] == 0
    back = ChatClient(people_server.base_url, cookie=page.cookie, session_id=page.session_id)
    await back.connect()
    tokens = await prompt_tokens_of(people_server, back, "And?")
    assert tokens > LONG_TURN_WORDS, "the earlier turn is still in the prompt"
    await back.close()


@in_loop
async def test_two_users_cannot_reach_each_others_conversations(people_server: AppServer) -> None:
    alice, bob = await signed_in(people_server, ALICE), await signed_in(people_server, BOB)
    file_id = await alice.upload("secret.txt", b"alice's private notes", "text/plain")
    assert (await alice.ask("A private question.", file_ids=[file_id])).final is not None
    thread = await stored_thread(alice, alice.thread_id, steps=2)  # type: ignore[arg-type]
    answer = next(s for s in thread["steps"] if s["type"] == "assistant_message")
    mine = await alice.http("PUT", "/feedback", json={"sessionId": alice.session_id,
                            "feedback": {"forId": answer["id"], "value": 1, "comment": "good"}})  # fmt: skip
    assert mine.status_code == 200
    feedback_id = mine.json()["feedbackId"]
    listed = await bob.http("POST", "/project/threads", json={"pagination": {"first": 50}, "filter": {}})
    assert alice.thread_id not in {t["id"] for t in listed.json()["data"]}
    for method, path, body in (
        ("GET", f"/project/thread/{alice.thread_id}", None),
        ("PUT", "/project/thread", {"threadId": alice.thread_id, "name": "mine now"}),
        ("DELETE", "/project/thread", {"threadId": alice.thread_id}),
        ("GET", f"/project/thread/{alice.thread_id}/element/{file_id}", None),
        ("GET", f"/project/file/{file_id}?session_id={alice.session_id}", None),
        ("PUT", "/feedback", {"sessionId": bob.session_id, "feedback": {"forId": answer["id"], "value": 0}}),
        ("PUT", "/feedback", {"sessionId": bob.session_id,
                              "feedback": {"id": feedback_id, "forId": answer["id"], "value": 0}}),
        ("DELETE", "/feedback", {"feedbackId": feedback_id}),
    ):  # fmt: skip
        response = await bob.http(method, path, json=body)
        assert response.status_code in (401, 403, 404), f"{method} {path}: {response.status_code}"
        assert "alice's private notes" not in response.text and "A private question" not in response.text
    guessed = await bob.http("GET", f"/project/thread/{uuid.uuid4()}")
    assert guessed.status_code == 404, guessed.text
    with pytest.raises(Exception):  # noqa: B017 - socket.io refuses the connection
        await ChatClient(people_server.base_url, cookie=bob.cookie).resume(alice.thread_id)  # type: ignore[arg-type]
    still = await stored_thread(alice, alice.thread_id, steps=2)  # type: ignore[arg-type]
    assert still["name"] != "mine now" and any(s.get("feedback") for s in still["steps"])
    assert await asyncio.to_thread(metric, people_server, "chat_feedback_total", value="up") >= 1
    await alice.close()
    await bob.close()


@in_loop
async def test_conversations_are_renamed_and_deleted_with_every_row(people_server: AppServer) -> None:
    bob = await signed_in(people_server, BOB)
    assert (await bob.ask("Something to forget.")).final is not None
    thread_id = bob.thread_id
    await stored_thread(bob, thread_id, steps=2)  # type: ignore[arg-type]
    assert (
        await bob.http("PUT", "/project/thread", json={"threadId": thread_id, "name": "Renamed"})
    ).status_code == 200
    listed = await bob.http("POST", "/project/threads", json={"pagination": {"first": 50}, "filter": {}})
    assert {"id": thread_id, "name": "Renamed"}.items() <= next(
        t for t in listed.json()["data"] if t["id"] == thread_id
    ).items()
    assert (await bob.http("DELETE", "/project/thread", json={"threadId": thread_id})).status_code == 200
    with sqlite3.connect(data_dir(people_server) / "chat.db") as db:
        for table, column in (
            ("threads", '"id"'),
            ("steps", '"threadId"'),
            ("thread_documents", "thread_id"),
        ):
            assert (
                db.execute(f"SELECT COUNT(*) FROM {table} WHERE {column} = ?", (thread_id,)).fetchone()[0]
                == 0
            )
    await bob.close()


@in_loop
async def test_stats_is_for_administrators(people_server: AppServer) -> None:
    bob = await signed_in(people_server, BOB)
    refused = await bob.ask("/stats")
    assert "for administrators" in (refused.final or "")
    admin = await signed_in(people_server, ADMIN)
    report = await admin.ask("/stats", timeout=120)
    assert "for administrators" not in (report.final or "") and report.final
    await bob.close()
    await admin.close()


@in_loop
async def test_a_removed_account_is_signed_out(people_server: AppServer) -> None:
    accounts(data_dir(people_server), "add", "leaver", stdin="leavers-password\n")
    leaver = await signed_in(people_server, ("leaver", "leavers-password"))
    await leaver.close()
    accounts(data_dir(people_server), "remove", "leaver")
    await asyncio.sleep(settings_of(people_server).sign_in_check_seconds + 1)  # the check's cached answer
    response = await leaver.http("POST", "/project/threads", json={"pagination": {"first": 5}, "filter": {}})
    assert response.status_code == 401
    with pytest.raises(SignInError):
        await sign_in(people_server.base_url, "leaver", "leavers-password")


@in_loop
async def test_a_locked_database_degrades_cleanly_and_saving_resumes(people_server: AppServer) -> None:
    alice = await signed_in(people_server, ALICE)
    assert (await alice.ask("Before the trouble.")).final is not None
    thread_id = alice.thread_id
    await stored_thread(alice, thread_id, steps=2)  # type: ignore[arg-type]
    locker = sqlite3.connect(data_dir(people_server) / "chat.db", timeout=0, isolation_level=None)
    locker.execute("BEGIN EXCLUSIVE")  # another program holds the database
    try:
        first = await alice.ask("During the trouble.")
        assert first.final, "chat keeps working"
        # The reply's write fails after DATABASE_TIMEOUT_SECONDS (and once it has started: later
        # than that with a core busy elsewhere).
        timeout = settings_of(people_server).database_timeout_seconds + WAIT_SECONDS
        status = await people_server.poll(lambda s: s["history"]["available"] is False, timeout=timeout)
        assert status["history"]["reason"] == "locked"
        second = await alice.ask("Still in trouble.")
        assert second.final
        assert any("not being saved" in text for text in alice.notices()), alice.notices()
    finally:
        locker.rollback()
        locker.close()
    retry = settings_of(people_server).history_retry_seconds  # how often the database is tried again
    await people_server.poll(lambda s: s["history"]["available"], timeout=retry + WAIT_SECONDS)
    assert (await alice.ask("After the trouble.")).final is not None
    assert any("saved again" in text for text in alice.notices())
    thread = await stored_thread(alice, thread_id, steps=4)  # type: ignore[arg-type]
    outputs = [s["output"] for s in thread["steps"]]
    assert "Before the trouble." in outputs and "After the trouble." in outputs, (
        "stored rows intact, saving resumed"
    )
    await alice.close()


def test_a_public_address_without_sign_in_refuses_to_start(tmp_path: Path) -> None:
    env = {**os.environ, "DATA_DIR": str(tmp_path), "CHAINLIT_APP_ROOT": str(ROOT)}
    for name in ("AUTH_MODE", "ALLOW_ANONYMOUS", "CHAINLIT_AUTH_SECRET"):
        env.pop(name, None)
    chainlit = str(Path(sys.executable).with_name("chainlit"))
    result = subprocess.run([chainlit, "run", "app.py", "--headless", "--host", "0.0.0.0", "--port", "1"],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode != 0
    assert "Refusing to start" in result.stderr and "AUTH_MODE=password" in result.stderr, result.stderr[
        -2000:
    ]
    assert not any(tmp_path.iterdir()), "nothing was created before refusing"


# --- the page, in a real browser ----------------------------------------------------
@pytest.mark.browser
def test_browser_signs_in_chats_reloads_and_continues(people_server: AppServer) -> None:
    blocked: list[str] = []
    screenshots = ARTIFACTS / "screenshots"
    screenshots.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser, page = browser_page(playwright, blocked)
        try:
            sign_in_on_page(page, people_server, (BOB[0], "a wrong password"))
            page.get_by_text("Wrong user name or password.").wait_for(timeout=15_000)
            page.screenshot(path=str(screenshots / "sign-in-refused.png"))
            sign_in_on_page(page, people_server, BOB)
            wait_for_session(page)
            send_message(page, FIRST_MESSAGE)
            page.locator(ANSWER).first.wait_for(timeout=60_000)
            page.locator("#chat-submit").wait_for(timeout=60_000)
            until_sync(lambda: len(stored_messages(people_server, FIRST_MESSAGE)) >= 2, "the chat stored")
            page.reload()
            listed = page.locator('[id^="thread-"]:not(#thread-history)').first  # in the sidebar
            listed.wait_for(timeout=30_000)
            listed.click()
            earlier = page.locator(USER_STEP, has_text=FIRST_MESSAGE)
            earlier.wait_for(timeout=30_000)  # reopened: the stored messages are on the page again
            page.screenshot(path=str(screenshots / "reopened.png"))
            send_message(page, "And it goes on.")
            page.locator(USER_STEP, has_text="And it goes on.").wait_for(timeout=30_000)
            page.locator(ANSWER).nth(1).wait_for(timeout=60_000)
            page.screenshot(path=str(screenshots / "resumed.png"), full_page=True)
            font = page.evaluate(
                "[...document.fonts].some(f => f.family.includes('Inter') && f.status === 'loaded')"
                " && getComputedStyle(document.body).fontFamily"
            )
        finally:
            browser.close()
    assert not blocked, f"the page asked for the internet: {blocked}"
    assert font and "Inter" in font, f"the page renders with Inter served by the app: {font!r}"
