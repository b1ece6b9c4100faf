"""A real headless Chromium types a message and watches the answer stream in."""

from __future__ import annotations

from pathlib import Path

from playwright.sync_api import Page

from harness.browser import ANSWER, open_chat, send_message
from harness.documents import long_document
from harness.server import AppServer
from tests.conftest import ARTIFACTS


def record_answer_lengths(page: Page) -> None:
    """From now on, the page records the newest answer's length at every change of the page.

    Every render counts, however fast the answer comes (polling from here missed a short answer
    that streamed in under a second)."""
    page.evaluate(
        """(selector) => {
            window.answerLengths = [];
            new MutationObserver(() => {
                const answers = document.querySelectorAll(selector);
                const length = answers.length ? answers[answers.length - 1].textContent.length : 0;
                const lengths = window.answerLengths;
                if (length && lengths[lengths.length - 1] !== length) lengths.push(length);
            }).observe(document.body, {childList: true, subtree: true, characterData: true});
        }""",
        ANSWER,
    )


def test_browser_chat_streams_an_answer(default_server: AppServer, page: Page) -> None:
    open_chat(page, default_server.base_url)
    record_answer_lengths(page)
    send_message(page, "Write three sentences about the sea.")
    page.locator(ANSWER).first.wait_for(timeout=60_000)
    page.locator("#chat-submit").wait_for(timeout=120_000)  # the stop button turns back into send
    text = page.locator(ANSWER).last.inner_text()
    assert len(text.split()) >= 5
    lengths = page.evaluate("window.answerLengths ?? null")
    assert lengths is not None, "the page reloaded while answering"
    assert len(lengths) >= 3, f"the answer should grow while streaming, render by render: {lengths}"
    assert page.evaluate("window.cspViolations") == [], "the page's CSP blocked part of the page"
    screenshots = ARTIFACTS / "screenshots"
    screenshots.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(screenshots / "chat.png"), full_page=True)


def test_browser_upload_gets_a_summary(default_server: AppServer, page: Page, tmp_path: Path) -> None:
    document = tmp_path / "solar-report.txt"
    document.write_text(long_document(600, seed=11))
    summaries_before = default_server.status()["summary_cache"]["entries"]
    open_chat(page, default_server.base_url)
    page.locator("#upload-button-input").set_input_files(str(document))
    page.get_by_text("solar-report.txt").first.wait_for(timeout=30_000)
    send_message(page, "Summarize this document in three sentences.")
    page.locator(ANSWER).first.wait_for(timeout=120_000)
    page.locator("#chat-submit").wait_for(timeout=180_000)
    summary = page.locator(ANSWER).last.inner_text()
    assert len(summary.split()) >= 10, summary
    assert page.get_by_text("Failed to upload").count() == 0, "the upload was refused"
    assert default_server.status()["summary_cache"]["entries"] == summaries_before + 1, "a summary was made"
    assert page.evaluate("window.cspViolations") == [], "the page's CSP blocked part of the page"
    screenshots = ARTIFACTS / "screenshots"
    screenshots.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(screenshots / "summary.png"), full_page=True)
