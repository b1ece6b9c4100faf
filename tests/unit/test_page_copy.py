"""What the page says and shows of its own (no server): the sign-in form asks for a user name in every
language and names a wrong password in words, no raw error toast covers the form, and the product's
logo and icon replace Chainlit's (in a real Chromium: tests/system/browser/test_sign_in_page.py)."""

from __future__ import annotations

import inspect
import json
import re
import tomllib
from pathlib import Path

import pytest
from chainlit import server as chainlit_server
from PIL import Image

ROOT = Path(__file__).parents[2]
TRANSLATIONS = sorted((ROOT / ".chainlit" / "translations").glob("*.json"))
MAIL = re.compile(
    r"mail|@|メール|邮箱|信箱|이메일|ইমেইল|ईमेल|ઈમેલ|ಇಮೇಲ್|ഇമെയിൽ|மின்னஞ்சல்|ఇమెయిల్|אימייל|البريد|ταχυδρομείου", re.I
)


def login_copy(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))["auth"]["login"]


def test_the_sign_in_form_asks_for_a_user_name() -> None:
    assert (
        login_copy(ROOT / ".chainlit" / "translations" / "en-US.json")["form"]["email"]["label"]
        == "User name"
    )


@pytest.mark.parametrize("path", TRANSLATIONS, ids=lambda path: path.stem)
def test_no_language_asks_for_an_email_address(path: Path) -> None:
    field = login_copy(path)["form"]["email"]
    assert not any(MAIL.search(text) for text in field.values()), field


@pytest.mark.parametrize("path", TRANSLATIONS, ids=lambda path: path.stem)
def test_a_wrong_password_is_named_in_every_language(path: Path) -> None:
    """The form looks Chainlit's 401 detail up as `auth.login.errors.<detail>` (as is, then in lower
    case); without the key it says only "Unable to sign in"."""
    [detail] = re.findall(r'detail="(\w+)"', inspect.getsource(chainlit_server._authenticate_user))
    assert detail == "credentialssignin"
    assert login_copy(path)["errors"].get(detail), f"{path.stem} has no auth.login.errors.{detail}"


def test_no_raw_error_toast_covers_the_sign_in_form() -> None:
    config = tomllib.loads((ROOT / ".chainlit" / "config.toml").read_text(encoding="utf-8"))
    css_url = config["UI"]["custom_css"]
    assert css_url.startswith("/public/")
    css = (ROOT / css_url.lstrip("/")).read_text(encoding="utf-8")
    assert re.search(r"body:has\(form #password\) \[data-sonner-toaster\] \{\s*display: none", css)


@pytest.mark.parametrize(("name", "size"), [("logo_dark", None), ("logo_light", None), ("favicon", (64, 64))])
def test_the_product_has_its_own_logo_and_icon(name: str, size: tuple[int, int] | None) -> None:
    """Chainlit serves public/logo_<theme>.* at /logo and public/favicon.* at /favicon (also every
    avatar without a picture of its own)."""
    with Image.open(ROOT / "public" / f"{name}.png") as image:
        assert image.format == "PNG" and image.mode == "RGBA"
        assert image.size == size if size else image.width > 3 * image.height >= 100


def test_the_composer_calls_the_menu_commands_not_tools() -> None:
    english = json.loads((ROOT / ".chainlit" / "translations" / "en-US.json").read_text(encoding="utf-8"))
    assert english["chat"]["commands"]["button"] == "Commands"
