"""The unsent-upload rule (unsent_uploads.py) applied to Chainlit: its upload route, the files it
keeps per session, and the messages that send them.

- `UnsentUploadBounds` (ASGI, in front of `POST /project/file`): an upload that would pass a chat's
  or a person's bound is refused before Chainlit reads it; one that passes (its size known only once
  written: a body without Content-Length) is deleted and refused; one Chainlit keeps is held unsent.
- `ChainlitUploads.sent`: a message that passed the socket guard sends its files: they no longer
  count, and are deleted once the message has been handled (the turn keeps a document's text, never
  the upload: services/chat/attachments.py deletes what it read), so a message that reads nothing (a
  command, a refused turn) cannot keep them either; a message naming a file no longer held is
  refused (`missing`).
- `ChainlitUploads.sweep` (each maintenance round): uploads unsent for UNSENT_UPLOAD_SECONDS are
  deleted from the session's `files` dict and its folder, while their page may still be open; chats
  Chainlit dropped are forgotten.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

from chainlit.session import WebsocketSession

from services.config import Settings
from services.web.body_limit import declared_length
from services.web.chat_feedback import person_of
from services.web.unsent_uploads import Pending, Refusal, UnsentUploads, UploadBounds, gone_detail
from services.web.upload_guard import (
    DEFAULT_UPLOAD_PATH,
    UPLOAD_LINGER_SECONDS,
    ASGIApp,
    Message,
    Receive,
    Scope,
    Send,
    answer_detail,
    is_post_on,
    refuse_unread,
    upload_session_id,
)

logger = logging.getLogger(__name__)


def page_alive(session_id: str) -> bool:
    return WebsocketSession.get_by_id(session_id) is not None


def delete_file(session: Any, file_id: str) -> bool:
    """Take an upload out of a Chainlit session: its `files` entry and its file in the session's
    folder (nothing outside it). True when there was one."""
    entry = session.files.pop(file_id, None)
    if entry is None:
        return False
    path = Path(entry["path"])
    if path.parent == Path(session.files_dir):
        path.unlink(missing_ok=True)
    return True


def _delete_files(session: Any, file_ids: list[str]) -> None:
    for file_id in file_ids:
        delete_file(session, file_id)


class ChainlitUploads:
    """The unsent uploads of this process's Chainlit sessions (one, built with the edge)."""

    def __init__(self, ledger: UnsentUploads, people_sign_in: bool) -> None:
        self.ledger = ledger
        self.people_sign_in = people_sign_in  # False: the local user, told apart by address

    @classmethod
    def from_settings(cls, settings: Settings, people_sign_in: bool) -> ChainlitUploads:
        return cls(UnsentUploads(UploadBounds.from_settings(settings)), people_sign_in)

    def person(self, session: Any) -> str:
        return person_of(session, self.people_sign_in)

    def missing(self, session: Any, file_ids: list[str]) -> bool:
        """Whether a message names a file this session does not hold (Chainlit would drop it unsaid)."""
        return any(file_id not in session.files for file_id in file_ids)

    def gone_detail(self) -> str:
        return gone_detail(self.ledger.bounds.expiry_seconds)

    def sent(self, session: Any, file_ids: list[str], handling: asyncio.Task | None) -> None:
        """A message sends these files: no longer held against the bounds; the uploads among them are
        deleted once `handling` (Chainlit's task that runs the message's turn) ends, whatever the turn
        did with them (a turn reads a document's text and keeps that; a command or a refused turn
        reads nothing). Files the app attached to its answers stay."""
        uploads = self.ledger.sent(session.id, file_ids)
        if not uploads:
            return
        if handling is None or handling.done():
            _delete_files(session, uploads)
        else:
            handling.add_done_callback(lambda _: _delete_files(session, uploads))

    async def sweep(self) -> int:
        """Delete every upload unsent for too long; forget chats Chainlit dropped. Returns the count."""
        self.ledger.prune(page_alive)
        deleted = 0
        for session_id, file_id in self.ledger.expired():
            session = WebsocketSession.get_by_id(session_id)
            if session is not None and delete_file(session, file_id):
                deleted += 1
        if deleted:
            logger.info(
                "deleted %d upload(s) not sent within %.0f s", deleted, self.ledger.bounds.expiry_seconds
            )
        return deleted


class UnsentUploadBounds:
    """Holds each upload Chainlit keeps against its chat's and person's bounds (pure ASGI)."""

    def __init__(
        self,
        app: ASGIApp,
        uploads: ChainlitUploads,
        path: str = DEFAULT_UPLOAD_PATH,
        linger_seconds: float = UPLOAD_LINGER_SECONDS,
    ) -> None:
        self.app = app
        self.uploads = uploads
        self.path = path
        self.linger_seconds = linger_seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        session = _uploads_session(scope) if is_post_on(scope, self.path) else None
        if session is None:  # not an upload, or Chainlit answers 404 for its session
            await self.app(scope, receive, send)
            return
        ledger = self.uploads.ledger
        ledger.prune(page_alive)  # a person's closed chats count no more
        admitted = ledger.admit(session.id, self.uploads.person(session), declared_length(scope) or 0)
        if isinstance(admitted, Refusal):
            logger.info("upload refused (%d): %s", admitted.status, admitted.detail)
            await refuse_unread(receive, send, admitted.status, admitted.detail, self.linger_seconds)
            return
        try:
            await self._held_call(scope, receive, send, session, admitted)
        finally:
            ledger.release(admitted)  # a no-op once kept

    async def _held_call(
        self, scope: Scope, receive: Receive, send: Send, session: Any, pending: Pending
    ) -> None:
        """Chainlit's answer is held back until the upload is kept, or replaced by a refusal."""
        held: list[Message] = []

        async def holding_send(message: Message) -> None:
            if held or (message["type"] == "http.response.start" and message["status"] == 200):
                held.append(message)
                if message["type"] == "http.response.body" and not message.get("more_body", False):
                    await self._answer(send, held, session, pending)
                return
            await send(message)

        await self.app(scope, receive, holding_send)

    async def _answer(self, send: Send, held: list[Message], session: Any, pending: Pending) -> None:
        body = b"".join(m.get("body", b"") for m in held if m["type"] == "http.response.body")
        file_id = _file_id(body)
        entry = session.files.get(file_id) if file_id else None
        if entry is not None:
            refusal = self.uploads.ledger.keep(pending, file_id, int(entry.get("size") or 0))
            if refusal is not None:
                delete_file(session, file_id)
                logger.info("upload deleted (%d): %s", refusal.status, refusal.detail)
                await answer_detail(send, refusal.status, refusal.detail)
                return
        for message in held:
            await send(message)


def _uploads_session(scope: Scope) -> Any:
    """The Chainlit session an upload names (`?session_id=`), if its page is connected."""
    session_id = upload_session_id(scope)
    return WebsocketSession.get_by_id(session_id) if session_id else None


def _file_id(body: bytes) -> str | None:
    try:
        answer = json.loads(body)
    except ValueError:
        return None
    file_id = answer.get("id") if isinstance(answer, dict) else None
    return file_id if isinstance(file_id, str) else None


def install_unsent_upload_bounds(fastapi_app: Any, uploads: ChainlitUploads) -> None:
    """Put the bounds in front of Chainlit's upload route; call before `install_upload_guard`, so the
    size guard and the wait for the page's session come first."""
    fastapi_app.add_middleware(UnsentUploadBounds, uploads=uploads)
