"""Web edge settings: how much a client may send in one request, and how much it may store."""

from __future__ import annotations

from dataclasses import dataclass

from services.config.fields import setting


@dataclass(frozen=True)
class WebSettings:
    """Sizes a client's requests may have, and the text it may store through Chainlit's routes."""

    max_thread_name_chars: int = setting(
        200,
        "MAX_THREAD_NAME_CHARS",
        "Longest conversation name: the name Chainlit makes from a conversation's first message is "
        "cut to it, and the sidebar lists no longer one.",
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
