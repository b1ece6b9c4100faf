"""Presets and the model menu in a real Chromium, on the two-model server (tests/system/presets):
a default system prompt set in the settings panel applies to the next new chat, a saved template is
picked from the starters, and a model picked in the chat profile menu answers."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import Page, expect, sync_playwright

from harness.browser import (
    ANSWER,
    USER_STEP,
    browser_page,
    send_message,
    sign_in_on_page,
    wait_for_answer,
    wait_for_session,
)
from harness.server import AppServer
from tests.conftest import ARTIFACTS
from tests.system.conftest import ADMIN

# two models in one server: per commit, test_presets_store.py and tests/unit/test_presets.py
pytestmark = pytest.mark.long

SCREENSHOTS = ARTIFACTS / "screenshots"
PROMPT = "Answer like a ship's captain."


@pytest.fixture(scope="module")
def page(models_server: AppServer) -> Iterator[Page]:
    """One signed-in page (the administrator: the socket.io tests use Alice and Bob) for the module."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    blocked: list[str] = []
    with sync_playwright() as playwright:
        browser, page = browser_page(playwright, blocked)
        try:
            sign_in_on_page(page, models_server, ADMIN)
            wait_for_session(page)
            yield page
        finally:
            browser.close()
    assert not blocked, f"the page asked for the internet: {blocked}"


def new_chat(page: Page) -> None:
    page.locator("#new-chat-button").click()
    confirm = page.locator("#new-chat-dialog #confirm, #confirm")
    if confirm.count():
        confirm.first.click()
    wait_for_session(page)


def open_settings(page: Page) -> None:
    page.locator("#chat-settings-open-modal").click()
    page.locator("#system_prompt").wait_for(timeout=10_000)


def stored_steps(page: Page, server: AppServer) -> list[dict[str, Any]]:
    """The newest conversation as the server stored it (the page's own cookie)."""
    listed = page.request.post(
        f"{server.base_url}/project/threads", data={"pagination": {"first": 1}, "filter": {}}
    )
    thread_id = listed.json()["data"][0]["id"]
    for _ in range(50):
        response = page.request.get(f"{server.base_url}/project/thread/{thread_id}")
        steps = response.json().get("steps") or [] if response.ok else []
        if any(s["type"] == "assistant_message" and s["output"] for s in steps):
            return steps
        page.wait_for_timeout(200)
    raise AssertionError(f"conversation {thread_id} was not stored")


def test_a_default_system_prompt_applies_to_the_next_new_chat(page: Page) -> None:
    open_settings(page)
    page.locator("#system_prompt").fill(PROMPT)
    page.locator("#save_as_default").click()
    page.screenshot(path=str(SCREENSHOTS / "presets-settings.png"))
    page.locator("#chat-settings #confirm").click()
    page.get_by_text("Saved as your default").wait_for(timeout=15_000)
    new_chat(page)
    open_settings(page)
    expect(page.locator("#system_prompt")).to_have_value(PROMPT)
    expect(page.locator("#save_as_default")).to_have_attribute("aria-checked", "false")
    page.screenshot(path=str(SCREENSHOTS / "presets-default-applied.png"))
    page.keyboard.press("Escape")


def test_a_saved_template_is_picked_from_the_starters(page: Page, models_server: AppServer) -> None:
    send_message(page, "/template save Three colours | Name three colours of the rainbow.")
    page.get_by_text("Template «Three colours» saved").wait_for(timeout=15_000)
    page.goto(models_server.base_url)  # the page reads its starters when it loads
    wait_for_session(page)
    starter = page.locator("#starter-three-colours")
    starter.wait_for(timeout=15_000)
    page.screenshot(path=str(SCREENSHOTS / "presets-starters.png"))
    starter.click()
    page.locator(USER_STEP, has_text="Name three colours of the rainbow.").wait_for(timeout=15_000)
    assert wait_for_answer(page)
    page.screenshot(path=str(SCREENSHOTS / "presets-starter-answered.png"), full_page=True)
    asked = [s for s in stored_steps(page, models_server) if s["type"] == "user_message"]
    assert asked[0]["output"] == "Name three colours of the rainbow."


def test_a_model_picked_in_the_menu_answers(page: Page, models_server: AppServer) -> None:
    new_chat(page)
    page.locator("#chat-profiles").click()
    page.locator('[data-test="select-item:tiny-other"]').click()
    wait_for_session(page)
    expect(page.locator("#chat-profiles")).to_contain_text("tiny-other")
    send_message(page, "Which model are you?")
    assert wait_for_answer(page)
    page.screenshot(path=str(SCREENSHOTS / "models-picked.png"), full_page=True)
    answers = [
        s for s in stored_steps(page, models_server) if s["type"] == "assistant_message" and s["output"]
    ]
    metadata = answers[-1]["metadata"]
    assert (json.loads(metadata) if isinstance(metadata, str) else metadata)["model"] == "tiny-other"
    assert page.locator(ANSWER).count() >= 1
