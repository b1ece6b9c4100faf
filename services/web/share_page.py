"""The read-only page of a share link (`GET /s/{token}`): server-rendered, every text escaped, no
script, no request to anywhere (its one style block is allowed by its hash), not cached, not
indexed, and sending no Referer (the link is the secret). Imported messages are marked so."""

from __future__ import annotations

import base64
import hashlib
import html

from fastapi.responses import HTMLResponse

from services.transfer.archive import Conversation, Message

STYLE = (
    "body{font-family:system-ui,sans-serif;max-width:46rem;margin:2rem auto;padding:0 1rem;"
    "color:#1d1d1f;background:#fafafa}h1{font-size:1.4rem}.note{color:#666;font-size:.85rem}"
    ".message{border-radius:.6rem;padding:.7rem 1rem;margin:.8rem 0;white-space:pre-wrap;"
    "overflow-wrap:anywhere}.user{background:#e8eefc}.assistant{background:#fff;border:1px solid #ddd}"
    ".imported{background:#f4f4f4;border:1px dashed #999;color:#333}"
    ".who{font-weight:600;font-size:.8rem;color:#555;margin-bottom:.3rem;white-space:normal}"
)
_STYLE_HASH = base64.b64encode(hashlib.sha256(STYLE.encode()).digest()).decode()
POLICY = (
    f"default-src 'none'; style-src 'sha256-{_STYLE_HASH}'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'"
)
HEADERS = {
    "Content-Security-Policy": POLICY,
    "Cache-Control": "no-store",
    "Referrer-Policy": "no-referrer",
    "X-Robots-Tag": "noindex, nofollow",
}
SPEAKERS = {"user": "Person", "assistant": "Assistant"}
# An imported message is the file's words: an imported "assistant" message is not styled, labelled
# or placed as one of the app's answers (content spoofing on the app's origin).
IMPORTED_SPEAKERS = {
    "user": "Person (imported)",
    "assistant": "Imported text, not written by this app",
}
IMPORTED_NOTE = (
    '<p class="note">Messages marked imported were imported from a file by whoever shared this link: '
    "this app did not write them.</p>"
)


def _page(title: str, body: str, status: int) -> HTMLResponse:
    document = (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<meta name="robots" content="noindex, nofollow">'
        f"<title>{html.escape(title)}</title><style>{STYLE}</style></head><body>{body}</body></html>"
    )
    return HTMLResponse(document, status_code=status, headers=HEADERS)


def _message(message: Message) -> str:
    kind, who = (
        (f"imported imported-{message.role}", IMPORTED_SPEAKERS)
        if message.imported
        else (message.role, SPEAKERS)
    )
    return (
        f'<div class="message {kind}"><div class="who">{who[message.role]}</div>'
        f"{html.escape(message.content)}</div>"
    )


def shared_page(conversation: Conversation) -> HTMLResponse:
    messages = "".join(_message(m) for m in conversation.messages)
    note = IMPORTED_NOTE if any(m.imported for m in conversation.messages) else ""
    body = (
        f"<h1>{html.escape(conversation.title)}</h1>"
        '<p class="note">A read-only copy of a conversation, as it was when it was shared.</p>'
        f"{note}{messages or '<p>No messages.</p>'}"
    )
    return _page(conversation.title, body, 200)


def missing_page() -> HTMLResponse:
    body = "<h1>Not found</h1><p>This link does not exist, or it was revoked or has expired.</p>"
    return _page("Not found", body, 404)
