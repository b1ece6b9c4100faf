"""A real headless Chromium (Debian's) for the browser tests: launching it with only loopback reachable,
signing in on the page, sending a message, waiting for the chat session, and for what a reload shows."""

from __future__ import annotations

import contextlib
import shutil
import sqlite3
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from harness.server import AppServer

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ANSWER = '.step[data-step-type="assistant_message"] .message-content'
USER_STEP = '.step[data-step-type="user_message"]'
# Everything the app's Content-Security-Policy blocks on the page (it must block nothing of its own).
RECORD_CSP_VIOLATIONS = """
    window.cspViolations = [];
    document.addEventListener("securitypolicyviolation",
        (e) => window.cspViolations.push(`${e.violatedDirective} ${e.blockedURI}`));
"""


class ChromiumMissingError(RuntimeError):
    """Debian's chromium is not installed."""


def browser_page(playwright: Any, blocked: list[str] | None = None) -> tuple[Any, Any]:
    """Chromium with every request to a non-loopback address blocked (and recorded in `blocked`)."""
    if not Path(CHROMIUM).exists():
        raise ChromiumMissingError("Debian's chromium is missing: run scripts/setup.sh --test")
    browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
    context = browser.new_context(viewport={"width": 1100, "height": 760})
    context.add_init_script(RECORD_CSP_VIOLATIONS)

    def only_loopback(route: Any) -> None:
        host = urlsplit(route.request.url).hostname or ""
        if route.request.url.startswith(("data:", "blob:")) or host in ("127.0.0.1", "localhost", "::1"):
            route.continue_()
        else:
            if blocked is not None:
                blocked.append(route.request.url)
            route.abort()

    context.route("**/*", only_loopback)
    return browser, context.new_page()


def wait_for_session(page: Any) -> None:
    """Wait until the server's chat session exists. The chat settings come from on_chat_start, after any
    sign-in redirect: the page can show its input first, then go to /login and back (a message typed
    in between is lost), and an upload sent before the session exists is refused ("Session not found")."""
    page.locator("#chat-settings-open-modal").wait_for(timeout=30_000)


def open_chat(page: Any, url: str) -> None:
    page.goto(url)
    wait_for_session(page)


def sign_in_on_page(page: Any, server: AppServer, who: tuple[str, str]) -> None:
    """Fill the password form (the page must still wait for the session when the sign-in is right)."""
    page.goto(server.base_url)
    page.locator("#email").wait_for(timeout=30_000)
    page.locator("#email").fill(who[0])
    page.locator("#password").fill(who[1])
    page.locator("#password").press("Enter")


def send_message(page: Any, text: str, attempts: int = 3) -> None:
    """Type `text` and send it. The page may re-render its input box just after an answer ends (the
    answer's buttons arrive), emptying what was typed: then it is typed again."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import expect

    for attempt in range(attempts):
        page.locator("#chat-input").fill(text)
        try:
            expect(page.locator("#chat-submit")).to_be_enabled(timeout=10_000)
            page.locator("#chat-submit").click(timeout=10_000)
            return
        except (AssertionError, PlaywrightTimeout):
            if attempt == attempts - 1:
                raise


def wait_for_answer(page: Any, timeout_ms: int = 60_000) -> str:
    """Wait until the newest answer has finished (the stop button turns back into send); its text."""
    page.locator(ANSWER).first.wait_for(timeout=timeout_ms)
    page.locator("#chat-submit").wait_for(timeout=timeout_ms)
    return page.locator(ANSWER).last.inner_text()


STORED_MESSAGES = """
    SELECT "type", "output" FROM steps
    WHERE "type" IN ('user_message', 'assistant_message')
      AND "threadId" IN (SELECT "threadId" FROM steps WHERE "type" = 'user_message' AND "output" = ?)
    ORDER BY "createdAt"
"""


def stored_messages(server: AppServer, text: str) -> list[tuple[str, str]]:
    """(type, output) of the messages stored in the conversation holding the user message `text`, oldest
    first: what a reload shows. The page shows an answer before the data layer's write lands (in a task
    of its own, later still with a core busy elsewhere), so a test polls this before it reloads."""
    path = Path(server.env["DATA_DIR"]) / "chat.db"
    with contextlib.closing(sqlite3.connect(path, timeout=10)) as db:
        rows = db.execute(STORED_MESSAGES, (text,)).fetchall()
    return [(kind, output or "") for kind, output in rows]
