"""Web edge settings: how much a client may send in one request, and how much it may store."""

from __future__ import annotations

from dataclasses import dataclass

from services.config.fields import setting


@dataclass(frozen=True)
class WebSettings:
    """Sizes a client's requests may have, and the text it may store through Chainlit's routes."""

    max_request_body_bytes: int = setting(
        1_048_576,
        "MAX_REQUEST_BODY_BYTES",
        "Largest HTTP request body on every route but the upload (MAX_UPLOAD_BYTES) and the API "
        "(API_MAX_BODY_BYTES); a larger one gets 413 before it is read into memory. The page's own "
        "requests (sign-in, rename, feedback, the sidebar) are a few KB.",
        1024,
    )
    max_thread_name_chars: int = setting(
        200,
        "MAX_THREAD_NAME_CHARS",
        "Longest conversation name: a rename to a longer one is refused (400); the name Chainlit "
        "makes from a conversation's first message is cut to it, and the sidebar lists no longer one.",
        1,
    )
    max_feedback_comment_chars: int = setting(
        4000,
        "MAX_FEEDBACK_COMMENT_CHARS",
        "Longest comment with a thumbs up or down; a longer one is refused (400).",
        1,
    )
    thread_list_page_max: int = setting(
        50,
        "THREAD_LIST_PAGE_MAX",
        "Most conversations one sidebar request lists (the page asks for 35, its search for 20); "
        "larger asks get this many and the next page.",
        1,
    )
    thread_search_max_chars: int = setting(
        200,
        "THREAD_SEARCH_MAX_CHARS",
        "Longest text the sidebar's search looks for; a longer search is cut to it.",
        1,
    )
