"""The sidebar's search in a real Chromium, on the shared password server: Alice finds her conversation
by a word of a later message (not its name), shown with that message's words, and Bob, searching the
same word, sees none of hers."""

from __future__ import annotations

import asyncio
import json
import secrets
from typing import Any

from playwright.sync_api import Page, expect, sync_playwright

from harness.browser import browser_page, sign_in_on_page, wait_for_session
from harness.chat_client import ChatClient
from harness.server import AppServer
from tests.conftest import ARTIFACTS
from tests.system.conftest import ALICE, BOB
from tests.system.helpers import stored_thread

SEARCH_INPUT = "[cmdk-input]"
RESULT = "[cmdk-item]"


async def conversation(server: AppServer, who: tuple[str, str], *messages: str) -> str:
    """A conversation of `who` through the chat socket, as the page makes one; its id once stored."""
    client = ChatClient(server.base_url, *who)
    await client.connect()
    for text in messages:
        assert (await client.ask(text)).final is not None
    thread_id = await client.conversation_id()
    await stored_thread(client, thread_id, steps=2 * len(messages), containing=messages[-1])
    await client.close()
    return thread_id


def search(page: Page, word: str) -> list[dict]:
    """Type `word` into the sidebar's search as a person would; the conversations the server answered."""
    page.locator("#search-chats-button").click()
    page.locator(SEARCH_INPUT).wait_for(timeout=10_000)

    def is_search(response: Any) -> bool:
        body = response.request.post_data or ""
        return response.url.endswith("/project/threads") and word in body

    with page.expect_response(is_search, timeout=15_000) as answered:
        page.locator(SEARCH_INPUT).press_sequentially(word, delay=40)
    return json.loads(answered.value.text())["data"]


def screenshot(page: Page, name: str) -> None:
    folder = ARTIFACTS / "screenshots"
    folder.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(folder / name))


def test_a_person_finds_only_their_own_conversation_by_a_word_of_a_message(
    password_server: AppServer,
) -> None:
    word = f"quetzal{secrets.token_hex(3)}"  # one word (letters and digits), new on every run
    asyncio.run(conversation(password_server, ALICE, "Bread recipes for a rainy day"))
    found_id = asyncio.run(conversation(
        password_server, ALICE, "Plans for the trip to Guatemala", f"Remind me to photograph a {word} there",
    ))  # fmt: skip
    asyncio.run(conversation(password_server, ALICE, "Notes on the garden"))
    bobs = asyncio.run(conversation(password_server, BOB, f"My own {word}x3 notes"))

    with sync_playwright() as browser:  # after the seeding: playwright runs an event loop of its own
        chromium, page = browser_page(browser)
        sign_in_on_page(page, password_server, ALICE)
        wait_for_session(page)
        answered = search(page, word)
        assert [thread["id"] for thread in answered] == [found_id]
        expect(page.locator(RESULT)).to_have_count(1, timeout=10_000)
        expect(page.locator(RESULT)).to_have_text(
            f"Plans for the trip to Guatemala — Remind me to photograph a {word} there"
        )
        screenshot(page, "search-alice.png")
        page.locator(RESULT).click()
        page.wait_for_url(f"**/thread/{found_id}", timeout=10_000)
        page.get_by_text(f"Remind me to photograph a {word} there").wait_for(timeout=15_000)
        chromium.close()

        chromium, page = browser_page(browser)
        sign_in_on_page(page, password_server, BOB)
        wait_for_session(page)
        answered = [thread["id"] for thread in search(page, word)]
        assert found_id not in answered and answered == [bobs], "Bob sees only his own (a prefix match)"
        expect(page.locator(RESULT)).to_have_text(
            f"My own {word}x3 notes", timeout=10_000
        )  # the name says it
        screenshot(page, "search-bob.png")
        page.locator(RESULT).click()
        page.wait_for_url(f"**/thread/{bobs}", timeout=10_000)
        chromium.close()
