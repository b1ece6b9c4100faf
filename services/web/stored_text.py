"""Text a client stores through Chainlit's HTTP routes, bounded: conversation names, feedback comments.

Chainlit 2.12 stores a rename (PUT /project/thread) and a feedback comment (PUT /feedback) of any
length: a 20 MB name was kept and then sent with every sidebar list. A name longer than
MAX_THREAD_NAME_CHARS and a comment longer than MAX_FEEDBACK_COMMENT_CHARS are refused (400, with the
limit in the detail), not cut: the person typed that text, and storing less than they typed without
telling them would be worse than asking them to shorten it. The name Chainlit makes from a
conversation's first message is cut instead, in the data layer: nobody typed it as a name.
"""

from __future__ import annotations

from typing import Any

from chainlit import server as chainlit_server
from chainlit.auth import get_current_user
from chainlit.types import UpdateThreadRequest
from fastapi import Depends, FastAPI, HTTPException, Request

from services.config import Settings
from services.history.thread_list import MAX_THREAD_NAME_CHARS
from services.web.routes import move_to_front


def check_feedback_comment(comment: str | None, settings: Settings) -> None:
    """Raise 400 when a feedback comment is longer than MAX_FEEDBACK_COMMENT_CHARS."""
    limit = settings.max_feedback_comment_chars
    if comment is not None and len(comment) > limit:
        raise HTTPException(
            400, f"The comment has {len(comment):,} characters; the limit is {limit:,}. Please shorten it."
        )


def install_name_cap(app: FastAPI) -> None:
    """Put a check of the new name's length in front of Chainlit's rename route."""
    signed_in = Depends(get_current_user)  # a default value: FastAPI cannot resolve a local alias here

    async def rename_thread(request: Request, payload: UpdateThreadRequest, user: Any = signed_in) -> Any:
        limit = MAX_THREAD_NAME_CHARS
        if len(payload.name) > limit:
            raise HTTPException(
                400,
                f"A conversation's name may have at most {limit:,} characters; this one has "
                f"{len(payload.name):,}.",
            )
        return await chainlit_server.rename_thread(request, payload, user)

    before = len(app.router.routes)
    app.add_api_route("/project/thread", rename_thread, methods=["PUT"], include_in_schema=False)
    move_to_front(app, app.router.routes[before:])
