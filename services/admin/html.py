"""The admin page's HTML, built on the server: every value escaped unless it is `Html` made here.

No inline script or style attribute: the page's look comes from /admin/admin.css, so the app's
Content-Security-Policy (script-src 'self', no inline scripts) holds unchanged. No JavaScript at all.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from html import escape
from urllib.parse import urlencode

from services.admin import csrf


class Html(str):
    """Markup built here from escaped parts: inserted as it is."""


Cell = str | int | float | None | Html


def text(value: Cell) -> Html:
    """A value as HTML: Html as it is, anything else escaped ("" for None)."""
    if isinstance(value, Html):
        return value
    return Html(escape("" if value is None else str(value)))


def join(parts: Iterable[Cell]) -> Html:
    return Html("".join(text(part) for part in parts))


def tag(name: str, content: Cell = None, **attributes: str | None) -> Html:
    """`<name attributes>content</name>`; attributes escaped, `class_` for class, None left out."""
    pairs = "".join(
        f' {key.rstrip("_").replace("_", "-")}="{escape(value)}"'
        for key, value in attributes.items()
        if value is not None
    )
    return Html(f"<{name}{pairs}>{text(content)}</{name}>")


def table(headers: Sequence[str], rows: Iterable[Sequence[Cell]], empty: str = "Nothing to show.") -> Html:
    body = [tag("tr", join(tag("td", cell) for cell in row)) for row in rows]
    if not body:
        return tag("p", empty, class_="empty")
    head = tag("thead", tag("tr", join(tag("th", h) for h in headers)))
    return tag("table", join([head, tag("tbody", join(body))]))


def hidden(name: str, value: str) -> Html:
    return Html(f'<input type="hidden" name="{escape(name)}" value="{escape(value)}">')


def field(label: str, name: str, kind: str = "text", value: str = "", **extra: str) -> Html:
    attributes = "".join(f' {key.replace("_", "-")}="{escape(v)}"' for key, v in extra.items())
    control = f'<input type="{kind}" name="{escape(name)}" value="{escape(value)}"{attributes}>'
    return tag("label", join([label, Html(control)]))


def choice(label: str, name: str, options: Sequence[str], chosen: str = "") -> Html:
    items = join(
        Html(f'<option value="{escape(o)}"{" selected" if o == chosen else ""}>{escape(o)}</option>')
        for o in options
    )
    return tag("label", join([label, Html(f'<select name="{escape(name)}">{items}</select>')]))


def post_form(action: str, token: str, controls: Iterable[Cell], button: str, danger: bool = False) -> Html:
    """A POST form carrying the sign-in's CSRF token."""
    submit = tag("button", button, type="submit", class_="danger" if danger else None)
    inner = join([hidden(csrf.FIELD, token), *controls, submit])
    return Html(f'<form method="post" action="{escape(action)}" class="inline">{inner}</form>')


def get_form(action: str, controls: Iterable[Cell], button: str) -> Html:
    inner = join([*controls, tag("button", button, type="submit")])
    return Html(f'<form method="get" action="{escape(action)}" class="inline">{inner}</form>')


def link(href: str, label: str, query: Mapping[str, str] | None = None) -> Html:
    target = href + ("?" + urlencode({k: v for k, v in query.items() if v}) if query else "")
    return tag("a", label, href=target)


def layout(
    title: str,
    nav: Sequence[tuple[str, str]],
    current: str,
    admin: str,
    body: Html,
    notice: str | None = None,
    error: str | None = None,
) -> str:
    """The whole page: navigation between sections, who is signed in, a notice or an error, the body."""
    links = join(
        tag("a", label, href=href, class_="current" if slug == current else None)
        for slug, label, href in ((s, label, f"/admin/{s}") for s, label in nav)
    )
    messages = join(
        [
            tag("p", notice, class_="notice") if notice else "",
            tag("p", error, class_="error", role="alert") if error else "",
        ]
    )
    who = tag("span", f"signed in as {admin}", class_="who")
    header = tag("header", join([tag("strong", "Admin"), tag("nav", links), who, tag("a", "Chat", href="/")]))
    main = tag("main", join([tag("h1", title), messages, body]))
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{escape(title)} · Admin</title>"
        '<link rel="stylesheet" href="/admin/admin.css"></head>'
        f"<body>{header}{main}</body></html>"
    )
