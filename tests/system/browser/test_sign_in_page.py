"""The sign-in page in a real Chromium, on the shared password server: it shows the product's logo,
asks for a user name, and a wrong password is named in words under the form, with no raw error toast
over it (the copy and files themselves, without a browser: tests/unit/test_page_copy.py)."""

from __future__ import annotations

import re
import secrets

from playwright.sync_api import Page, expect

from harness.chat_client import new_address
from harness.server import ROOT, AppServer
from tests.conftest import ARTIFACTS

SCREENSHOTS = ARTIFACTS / "screenshots"


def test_the_sign_in_page_asks_for_a_user_name_and_names_a_wrong_password(
    password_server: AppServer, page: Page
) -> None:
    page.set_extra_http_headers({"X-Forwarded-For": new_address()})  # its failure counts apart
    page.goto(password_server.base_url + "/login")
    page.locator("#email").wait_for(timeout=30_000)
    expect(page.locator("label[for=email]")).to_have_text("User name")
    logo = page.locator("img.logo").first
    expect(logo).to_have_attribute("src", re.compile(r"/logo\?theme=(light|dark)"))
    page.wait_for_function("(image) => image.complete && image.naturalWidth > 0", arg=logo.element_handle())
    for path, name in (
        ("/logo?theme=light", "logo_light"),
        ("/logo?theme=dark", "logo_dark"),
        ("/favicon", "favicon"),
    ):
        served = page.request.get(password_server.base_url + path)
        assert served.ok and served.body() == (ROOT / "public" / f"{name}.png").read_bytes(), path

    page.locator("#email").fill(f"nobody-{secrets.token_hex(3)}")
    page.locator("#password").fill("not the password")
    page.locator("#password").press("Enter")
    expect(page.get_by_text("Wrong user name or password.")).to_be_visible(timeout=15_000)
    raw = page.get_by_text("credentialssignin")
    expect(raw).to_have_count(1, timeout=5_000)  # Chainlit made its toast of the 401...
    expect(raw).to_be_hidden()  # ...which nobody sees over the form
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "sign-in-wrong-password.png"))
