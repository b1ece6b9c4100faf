"""The HTTP routes of export, import and share links, in front of Chainlit's catch-all page route.

Signed in with the chat's cookie (Chainlit's `get_current_user`; ended sign-ins are refused before,
services/web/sign_in_sessions.py), a person reaches only their own conversations: anyone else's
answers 404, as a missing one does.

- GET /conversations/{thread_id}/export?format=md|json: one conversation, as a download;
- GET /conversations/export: all of them (EXPORT_MAX_CONVERSATIONS), one JSON archive, streamed;
- POST /conversations/import (multipart, field `file`, at most IMPORT_MAX_BYTES): 200 with the new
  conversations and what was left out (empty messages), 400 with what is wrong with the file, 429
  with Retry-After past a limit of the person's (services/transfer/limits.py): nothing stored; 500
  naming what stayed if storing failed midway and could not be undone;
- POST /conversations/{thread_id}/share: a new link (shown once) to a snapshot; DELETE revokes the
  conversation's links; GET /s/{token}: the snapshot's read-only page, no sign-in needed.
The share routes answer 404 unless SHARING=true.
"""

from __future__ import annotations

from typing import Any

from chainlit.auth import get_current_user
from chainlit.config import config as chainlit_config
from fastapi import Depends, FastAPI, HTTPException, Request, UploadFile
from fastapi.responses import JSONResponse, Response, StreamingResponse

from services.runtime import Runtime
from services.transfer.archive import BadImport
from services.transfer.limits import ImportLimited
from services.transfer.service import Transfers
from services.transfer.store import PartlyStored
from services.web.body_limit import Scope, route_path
from services.web.routes import move_to_front
from services.web.share_page import missing_page, shared_page

IMPORT_PATH = "/conversations/import"
SHARE_PAGE = "/s/"
MULTIPART_OVERHEAD_BYTES = 64 * 1024  # the form's boundaries and part headers around the file
NO_STORE = {"Cache-Control": "no-store"}
signed_in = Depends(get_current_user)


def with_import_limit(limit_for: Any, import_max_bytes: int) -> Any:
    """The body limit of every route, with IMPORT_MAX_BYTES (and the form around it) for imports."""

    def limit(scope: Scope) -> int | None:
        if route_path(scope) == IMPORT_PATH and scope.get("method") == "POST":
            return import_max_bytes + MULTIPART_OVERHEAD_BYTES
        return limit_for(scope)

    return limit


def share_url(request: Request, token: str) -> str:
    return str(request.base_url).rstrip("/") + SHARE_PAGE + token


class TransferRoutes:
    """The route handlers over the runtime's Transfers (None where nothing is kept: every route 404)."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    def _transfers(self, user: Any, sharing: bool = False) -> Transfers:
        history = self.runtime.history
        transfers = self.runtime.transfers
        if transfers is None or history is None or (sharing and not self.runtime.settings.sharing):
            raise HTTPException(404, "Not Found")
        if user is None:
            raise HTTPException(401, "Unauthorized")
        if not history.available:
            raise HTTPException(503, "Chat history is unavailable right now: try again in a moment.")
        return transfers

    async def export_one(self, thread_id: str, format: str = "md", user: Any = signed_in) -> Response:
        exported = await self._transfers(user).export_one(thread_id, user.identifier, format)
        if exported is None:
            raise HTTPException(
                404, "Conversation not found" if format in ("md", "json") else "Unknown format"
            )
        disposition = {"Content-Disposition": f'attachment; filename="{exported.filename}"'}
        return Response(exported.text, media_type=exported.media_type, headers={**disposition, **NO_STORE})

    async def export_all(self, user: Any = signed_in) -> StreamingResponse:
        chunks = self._transfers(user).export_all(user.identifier)
        headers = {
            "Content-Disposition": 'attachment; filename="conversations.json"',
            "Cache-Control": "no-store",
        }
        return StreamingResponse(_encoded(chunks), media_type="application/json", headers=headers)

    async def import_file(self, file: UploadFile, user: Any = signed_in) -> JSONResponse:
        transfers = self._transfers(user)
        data = await file.read(self.runtime.settings.import_max_bytes + 1)
        try:
            imported = await transfers.import_file(user.identifier, data, chainlit_config.ui.name)
        except ImportLimited as error:
            retry = {"Retry-After": str(error.retry_after_seconds)}
            raise HTTPException(429, str(error), headers=retry) from None
        except BadImport as error:
            raise HTTPException(400, str(error)) from None
        except PartlyStored as error:
            detail = "The import failed midway; these conversations were stored and could not be removed."
            return JSONResponse({"detail": detail, "stored": error.titles}, status_code=500)
        listed = [{"id": i, "title": t} for i, t in zip(imported.thread_ids, imported.titles, strict=True)]
        left_out = {
            "empty_messages": imported.empty_messages,
            "empty_conversations": imported.empty_conversations,
        }
        return JSONResponse({"imported": len(listed), "conversations": listed, "left_out": left_out})

    async def share(self, request: Request, thread_id: str, user: Any = signed_in) -> JSONResponse:
        created = await self._transfers(user, sharing=True).share(thread_id, user.identifier)
        if created is None:
            raise HTTPException(404, "Conversation not found")
        return JSONResponse({"url": share_url(request, created.token), "expires_at": created.expires_at})

    async def revoke(self, thread_id: str, user: Any = signed_in) -> JSONResponse:
        revoked = await self._transfers(user, sharing=True).revoke(thread_id, user.identifier)
        if revoked is None:
            raise HTTPException(404, "Conversation not found")
        return JSONResponse({"revoked": revoked})

    async def shared(self, token: str) -> Response:
        transfers = self.runtime.transfers
        if transfers is None or not self.runtime.settings.sharing:
            return missing_page()
        conversation = await transfers.shared(token)
        return missing_page() if conversation is None else shared_page(conversation)


async def _encoded(chunks: Any) -> Any:
    async for chunk in chunks:
        yield chunk.encode()


def install_transfer_routes(app: FastAPI, runtime: Runtime) -> None:
    routes = TransferRoutes(runtime)
    before = len(app.router.routes)
    for path, endpoint, method in (
        ("/conversations/export", routes.export_all, "GET"),
        ("/conversations/{thread_id}/export", routes.export_one, "GET"),
        (IMPORT_PATH, routes.import_file, "POST"),
        ("/conversations/{thread_id}/share", routes.share, "POST"),
        ("/conversations/{thread_id}/share", routes.revoke, "DELETE"),
        (SHARE_PAGE + "{token}", routes.shared, "GET"),
    ):
        app.add_api_route(path, endpoint, methods=[method], include_in_schema=False)
    move_to_front(app, app.router.routes[before:])
