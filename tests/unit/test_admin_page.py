"""The admin page's pieces without a server: the CSRF token (one per sign-in, unforgeable without the
secret), the form parser (bounded, no repeated fields), escaping, and the SVG plot."""

from __future__ import annotations

import numpy as np
import pytest

from services.admin import csrf
from services.admin.gate import MAX_FIELD_CHARS, MAX_FIELDS, Refusal, parse_form
from services.admin.html import Html, layout, table, tag
from services.admin.live import PLOT_POINTS, svg_plot

SECRET = "s" * 48


def sign_in(who: str = "admin", generation: int = 0, at: int = 1_700_000_000) -> str:
    return csrf.sign_in_of(who, {"session": {"generation": generation, "signed_in_at": at}})


def test_the_csrf_token_belongs_to_one_sign_in() -> None:
    token = csrf.token_for(SECRET, sign_in())
    assert token == csrf.token_for(SECRET, sign_in())  # stable for the sign-in (a refreshed cookie too)
    assert csrf.token_matches(SECRET, sign_in(), token)
    for other in (sign_in("alice"), sign_in(generation=1), sign_in(at=1_700_000_001)):
        assert not csrf.token_matches(SECRET, other, token), other
    assert not csrf.token_matches("t" * 48, sign_in(), token)  # another install's secret
    for offered in (None, "", token[:-1], token + "x", "x" * 1000):
        assert not csrf.token_matches(SECRET, sign_in(), offered)
    assert not csrf.token_matches("", sign_in(), csrf.token_for("", sign_in()))  # no secret, no token
    assert sign_in() != csrf.sign_in_of("admin", {})  # a token without the claim names no sign-in


def test_forms_are_bounded_and_fields_unique() -> None:
    assert parse_form("a=1&b=&c=x+y%21") == {"a": "1", "b": "", "c": "x y!"}
    assert parse_form("") == {}
    for body in (
        "&".join(f"f{i}=1" for i in range(MAX_FIELDS + 1)),  # too many
        "a=1&a=2",  # repeated: which one would count?
        "a=" + "x" * (MAX_FIELD_CHARS + 1),
        "a=%00",
        "a=line%0Abreak",
        "noequals",
    ):
        with pytest.raises(Refusal) as refused:
            parse_form(body)
        assert refused.value.status == 400, body


def test_every_value_is_escaped_unless_built_as_html() -> None:
    hostile = '<script>alert(1)</script>"'
    page = layout(
        hostile, [("a", hostile)], "a", hostile, table(["h"], [[hostile]]), notice=hostile, error=hostile
    )
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert "<script" not in page.lower()  # and no script of the page's own either: CSP needs none
    assert tag("b", Html("<i>x</i>")) == "<b><i>x</i></b>"
    assert tag("a", "x", href='"><img src=x>') == '<a href="&quot;&gt;&lt;img src=x&gt;">x</a>'


def test_the_plot_is_svg_with_bounded_points_and_escaped_labels() -> None:
    times = np.arange(5000, dtype=float) - 5000
    values = {"<app>": np.linspace(0, 100, 5000), "gaps": np.where(np.arange(5000) % 2, np.nan, 3.0)}
    svg = svg_plot("Memory", times, values, "MB")
    assert svg.count("<polyline") == 2 and "&lt;app&gt;" in svg and "<app>" not in svg
    first = svg.split('points="')[1].split('"')[0]
    assert len(first.split()) == PLOT_POINTS
    assert "no samples yet" in svg_plot("Empty", np.empty(0), {"a": np.empty(0)}, "MB")
