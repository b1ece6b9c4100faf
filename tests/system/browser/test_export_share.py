"""Export, import and share from the real page (Chromium, the shared password server): `/export`
gives links that download the conversation, `/import` with a ChatGPT file attached puts it in the
sidebar, and `/share` gives a link that a browser without any sign-in opens read-only."""

from __future__ import annotations

import json
import re
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, expect, sync_playwright

from harness.browser import (
    ANSWER,
    browser_page,
    send_message,
    sign_in_on_page,
    wait_for_answer,
    wait_for_session,
)
from harness.server import AppServer
from tests.conftest import ARTIFACTS
from tests.system.conftest import ALICE

SCREENSHOTS = ARTIFACTS / "screenshots"


@pytest.fixture
def browser() -> Any:
    with sync_playwright() as playwright:
        browser, page = browser_page(playwright)
        yield playwright, browser, page
        browser.close()


def screenshot(page: Page, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / name), full_page=True)


def signed_in_chat(page: Page, server: AppServer) -> None:
    sign_in_on_page(page, server, ALICE)
    wait_for_session(page)


def reply_containing(page: Page, words: str) -> str:
    """The text of the newest assistant message holding `words` (waits for it)."""
    message = page.locator(ANSWER).filter(has_text=words).last
    message.wait_for(timeout=60_000)
    return message.inner_text()


def downloads_of(page: Page) -> list[Any]:
    """Downloads the page or any tab it opens starts (the chat's links open in a new tab)."""
    downloads: list[Any] = []
    page.on("download", lambda download: downloads.append(download))
    page.context.on("page", lambda tab: tab.on("download", lambda download: downloads.append(download)))
    return downloads


def test_export_from_the_page_downloads_the_conversation(password_server: AppServer, browser: Any) -> None:
    _, _, page = browser
    word = f"lynx{uuid.uuid4().hex[:6]}"
    signed_in_chat(page, password_server)
    send_message(page, f"The word of the day is {word}.")
    wait_for_answer(page)
    send_message(page, "/export")
    reply_containing(page, "all your conversations")
    downloads = downloads_of(page)
    page.locator(ANSWER).get_by_role("link", name="Markdown").last.click()
    deadline = time.monotonic() + 30
    while not downloads and time.monotonic() < deadline:
        page.wait_for_timeout(200)
    assert downloads, "clicking the link downloaded nothing"
    assert downloads[0].suggested_filename.endswith(".md")
    text = Path(downloads[0].path()).read_text()
    assert f"The word of the day is {word}." in text and "**Assistant**" in text
    assert page.evaluate("window.cspViolations") == [], "the page's CSP blocked part of the page"
    screenshot(page, "export.png")


def chatgpt_file(folder: Path, title: str) -> Path:
    def node(key: str, role: str | None, text: str, parent: str | None, children: list[str]) -> dict:
        message = {"author": {"role": role}, "create_time": 1_700_000_000.0,
                   "content": {"content_type": "text", "parts": [text]}} if role else None  # fmt: skip
        return {"id": key, "message": message, "parent": parent, "children": children}

    mapping = {
        "root": node("root", None, "", None, ["q"]),
        "q": node("q", "user", "Plan a day in Lisbon.", "root", ["a1", "a2"]),
        "a1": node("a1", "assistant", "An answer nobody kept.", "q", []),
        "a2": node("a2", "assistant", "Morning: Alfama. Afternoon: Belém.", "q", []),
    }
    path = folder / "conversations.json"
    path.write_text(json.dumps([{"title": title, "create_time": 1_700_000_000.0, "mapping": mapping,
                                 "current_node": "a2"}]))  # fmt: skip
    return path


def test_import_a_chatgpt_file_from_the_page_shows_it_in_the_sidebar(
    password_server: AppServer, browser: Any, tmp_path: Path
) -> None:
    _, _, page = browser
    title = f"Lisbon {uuid.uuid4().hex[:6]}"
    signed_in_chat(page, password_server)
    page.locator("#upload-button-input").set_input_files(str(chatgpt_file(tmp_path, title)))
    page.get_by_text("conversations.json").first.wait_for(timeout=30_000)
    send_message(page, "/import")
    assert f"«{title}»" in reply_containing(page, "Imported 1 conversation")
    page.reload()
    wait_for_session(page)
    page.get_by_text(title).first.click(timeout=30_000)
    expect(page.get_by_text("Morning: Alfama. Afternoon: Belém.")).to_be_visible(timeout=30_000)
    assert page.get_by_text("An answer nobody kept.").count() == 0, "only the shown branch was imported"
    assert page.get_by_text("Failed to upload").count() == 0
    screenshot(page, "import.png")


def test_a_share_link_opens_read_only_without_signing_in(password_server: AppServer, browser: Any) -> None:
    _, browser_, page = browser
    word = f"puffin{uuid.uuid4().hex[:6]}"
    signed_in_chat(page, password_server)
    send_message(page, f"Shared note: {word}.")
    wait_for_answer(page)
    send_message(page, "/share")
    [url] = re.findall(r"http://\S+/s/[A-Za-z0-9_-]+", reply_containing(page, "Anyone with this link"))
    screenshot(page, "share-made.png")
    stranger = browser_.new_context(viewport={"width": 900, "height": 700})  # no cookie of anyone's
    try:
        reader = stranger.new_page()
        violations: list[str] = []
        reader.on(
            "console",
            lambda message: violations.append(message.text) if "Content Security" in message.text else None,
        )
        response = reader.goto(url)
        assert response is not None and response.status == 200
        expect(reader.locator(".message.user")).to_contain_text(f"Shared note: {word}.")
        assert ALICE[0] not in reader.content()
        assert reader.locator("script").count() == 0 and reader.locator("#chat-input").count() == 0
        assert violations == [], violations
        screenshot(reader, "share-page.png")
    finally:
        stranger.close()
