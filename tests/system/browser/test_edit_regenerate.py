"""Edit and regenerate in a real Chromium on the shared password server: the page's own edit button
and the Regenerate button on the last answer, then a reload that shows only the new branch."""

from __future__ import annotations

from typing import Any

from playwright.sync_api import expect, sync_playwright

from harness.browser import (
    ANSWER,
    USER_STEP,
    browser_page,
    send_message,
    sign_in_on_page,
    stored_messages,
    wait_for_answer,
    wait_for_session,
)
from harness.server import AppServer
from harness.waiting import until_sync
from tests.conftest import ARTIFACTS
from tests.system.conftest import ALICE

SCREENSHOTS = ARTIFACTS / "screenshots"
FIRST = "Name one planet."
EDITED = "Name one ocean."


def edit_on_page(page: Any, old: str, new: str) -> None:
    """Hover the sent message, press its edit button, type the new text and confirm, as a person does."""
    sent = page.locator(USER_STEP, has_text=old)
    sent.hover()
    sent.locator(".edit-message").click()
    page.locator("#edit-chat-input").fill(new)
    page.locator(".confirm-edit").click()


def branch_stored(server: AppServer) -> bool:
    """The edited message and one answer to it are stored: what a reload will show."""
    stored = stored_messages(server, EDITED)
    asked = [text for kind, text in stored if kind == "user_message"]
    answered = [text for kind, text in stored if kind == "assistant_message"]
    return asked == [EDITED] and len(answered) == 1


def test_edit_and_regenerate_on_the_page_and_after_a_reload(password_server: AppServer) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    blocked: list[str] = []
    with sync_playwright() as playwright:
        browser, page = browser_page(playwright, blocked)
        try:
            sign_in_on_page(page, password_server, ALICE)
            wait_for_session(page)
            send_message(page, FIRST)
            old_answer = wait_for_answer(page)
            page.screenshot(path=str(SCREENSHOTS / "edit-before.png"))
            edit_on_page(page, FIRST, EDITED)
            expect(page.locator(USER_STEP, has_text=EDITED)).to_have_count(1, timeout=10_000)
            page.locator("#stop-button").wait_for(state="detached", timeout=60_000)
            new_answer = wait_for_answer(page)
            expect(page.locator(USER_STEP, has_text=FIRST)).to_have_count(0)
            expect(page.locator(ANSWER)).to_have_count(1)
            page.screenshot(path=str(SCREENSHOTS / "edit-after.png"))
            until_sync(lambda: branch_stored(password_server), "the new branch stored")
            page.reload()
            listed = page.locator('[id^="thread-"]:not(#thread-history)').first  # in the sidebar
            listed.wait_for(timeout=30_000)
            listed.click()
            page.locator(USER_STEP, has_text=EDITED).wait_for(timeout=30_000)
            expect(page.locator(USER_STEP)).to_have_count(1)
            expect(page.locator(ANSWER)).to_have_count(1)
            page.screenshot(path=str(SCREENSHOTS / "edit-reloaded.png"))
            regenerate = page.get_by_role("button", name="Regenerate")
            expect(regenerate).to_have_count(1, timeout=15_000)  # on the last answer, after a reload too
            answer_ids = page.locator(ANSWER).evaluate_all(
                "nodes => nodes.map(n => n.closest('[id^=step-]').id)"
            )
            regenerate.click()
            expect(page.locator(f"#{answer_ids[0]}")).to_have_count(0, timeout=30_000)
            page.locator(ANSWER).first.wait_for(timeout=60_000)
            page.locator("#chat-submit").wait_for(timeout=60_000)
            expect(page.get_by_role("button", name="Regenerate")).to_have_count(1, timeout=15_000)
            expect(page.locator(ANSWER)).to_have_count(1)
            page.screenshot(path=str(SCREENSHOTS / "regenerated.png"))
        finally:
            browser.close()
    assert not blocked, f"the page asked for the internet: {blocked}"
    assert old_answer and new_answer
