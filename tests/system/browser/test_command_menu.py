"""The `/` command menu in a real Chromium, on the shared password server: typing `/` lists the
commands with a line each, one picked and sent is answered by the service, and the stored message is
the typed command (the same over socket.io: tests/system/chat/test_commands.py)."""

from __future__ import annotations

import secrets

from playwright.sync_api import Page, expect

from harness.browser import ANSWER, sign_in_on_page, stored_messages, wait_for_session
from harness.server import AppServer
from harness.waiting import until_sync
from tests.conftest import ARTIFACTS
from tests.system.conftest import ALICE

SCREENSHOTS = ARTIFACTS / "screenshots"
MENU_ITEM = ".command-item"


def test_a_command_picked_from_the_menu_is_answered_by_the_service(
    password_server: AppServer, page: Page
) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    mark = f"menu{secrets.token_hex(3)}"
    sign_in_on_page(page, password_server, ALICE)
    wait_for_session(page)
    page.locator("#chat-input").press_sequentially("/")
    expect(page.locator(MENU_ITEM).first).to_be_visible(timeout=10_000)
    listed = page.locator(MENU_ITEM).all_inner_texts()
    assert any(item.startswith("help") and "What these commands do" in item for item in listed), listed
    page.screenshot(path=str(SCREENSHOTS / "command-menu.png"))
    page.locator("#chat-input").press_sequentially("he")  # narrows the menu to /help
    expect(page.locator(MENU_ITEM)).to_have_count(1)
    page.locator("#chat-input").press("Enter")  # picks it
    expect(page.locator(MENU_ITEM)).to_have_count(0)
    page.locator("#chat-input").press_sequentially(mark)  # typed after the picked command
    page.locator("#chat-input").press("Enter")  # sends it
    answer = page.locator(ANSWER).filter(has_text="/export").last
    answer.wait_for(timeout=30_000)
    assert "/template" in answer.inner_text() and "/stats" not in answer.inner_text()
    page.screenshot(path=str(SCREENSHOTS / "command-help.png"))
    stored = f"/help {mark}"
    until_sync(
        lambda: ("user_message", stored) in stored_messages(password_server, stored), "stored as typed", 15
    )
