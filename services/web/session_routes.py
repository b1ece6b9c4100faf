"""Chainlit's routes that act inside a page's live session, checked before Chainlit runs them.

Chainlit 2.12's element, action and MCP routes look the named session up and use it without
checking that it exists (`init_ws_context(None)` raised "Session not found"), and build objects from
the body's dicts unchecked (`element["display"]`, `Action(**action)`): an unknown session, a missing
key or a value of the wrong type each gave a 500 and a traceback. The routes put in front of them
here answer 404 for a session that is not live and 400 for a body Chainlit cannot use, then hand the
request to Chainlit's own route, which checks that the session is the caller's.

Its element route (`PUT /project/element`) writes a custom element's props as a new file into the
session's folder on every request, which nothing bounds; this app shows no custom elements, so the
route refuses them (403) after the same checks.

Its file route (`GET /project/file/{id}`) served an upload with the type its uploader chose, inline:
an uploaded HTML page ran its script on the app's origin. The route in front of it serves every file
as a download (`Content-Disposition: attachment`), not to be sniffed, in a sandbox without scripts.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any
from urllib.parse import quote

from chainlit import server as chainlit_server
from chainlit.action import Action
from chainlit.auth import get_current_user
from chainlit.config import config as chainlit_config
from chainlit.session import WebsocketSession
from chainlit.types import CallActionRequest, ConnectMCPRequest, DisconnectMCPRequest, ElementRequest
from fastapi import Depends, FastAPI, HTTPException
from starlette.responses import FileResponse, Response

from services.web.routes import move_to_front

ACTION_FIELDS = {field.name for field in dataclasses.fields(Action)}
TEXT = (str,)
OPTIONAL_TEXT = (str, type(None))
ACTION_TYPES = {
    "name": TEXT,
    "payload": (dict,),
    "label": TEXT,
    "tooltip": TEXT,
    "icon": OPTIONAL_TEXT,
    "forId": OPTIONAL_TEXT,
    "id": TEXT,
}
CUSTOM_ELEMENT_TYPES = {
    "id": TEXT,
    "name": TEXT,
    "display": TEXT,
    "props": (dict, type(None)),
    "forId": OPTIONAL_TEXT,
    "threadId": OPTIONAL_TEXT,
}
ELEMENT_DISPLAYS = ("inline", "side", "page")


def live_session(session_id: str) -> None:
    if WebsocketSession.get_by_id(session_id) is None:
        raise HTTPException(404, "Session not found")


def action_problem(action: dict[str, Any]) -> str | None:
    """Why Chainlit could not make an `Action` of this dict; None when it can."""
    if not {"name", "payload"} <= action.keys() or not action.keys() <= ACTION_FIELDS:
        return "an action has a name, a payload and no other fields than Chainlit's"
    if any(not isinstance(value, ACTION_TYPES.get(key, ())) for key, value in action.items()):
        return "an action field has the wrong type"
    return None


def element_problem(element: dict[str, Any]) -> str | None:
    """Why Chainlit could not make a custom element of this dict; None when it can (or it is not
    custom: Chainlit answers those itself)."""
    if element.get("type") != "custom":
        return None
    if not {"id", "name", "display"} <= element.keys():
        return "a custom element has an id, a name and a display"
    if any(not isinstance(element.get(key), kinds) for key, kinds in CUSTOM_ELEMENT_TYPES.items()):
        return "a custom element's field has the wrong type"
    return None if element["display"] in ELEMENT_DISPLAYS else "unknown display"


SIGNED_IN = Depends(get_current_user)  # the override in access.py refuses removed accounts


NO_CUSTOM_ELEMENTS = "This app shows no custom elements: there is none to update."


async def update_element(payload: ElementRequest, user: Any = SIGNED_IN) -> Any:
    live_session(payload.sessionId)
    if problem := element_problem(payload.element):
        raise HTTPException(400, problem)
    if payload.element.get("type") == "custom":  # Chainlit would write a file per request
        raise HTTPException(403, NO_CUSTOM_ELEMENTS)
    return await chainlit_server.update_thread_element(payload, user)


async def delete_element(payload: ElementRequest, user: Any = SIGNED_IN) -> Any:
    live_session(payload.sessionId)
    if problem := element_problem(payload.element):
        raise HTTPException(400, problem)
    return await chainlit_server.delete_thread_element(payload, user)


async def call_action(payload: CallActionRequest, user: Any = SIGNED_IN) -> Any:
    live_session(payload.sessionId)
    if problem := action_problem(payload.action):
        raise HTTPException(400, problem)
    return await chainlit_server.call_action(payload, user)


def mcp_enabled() -> None:
    if not chainlit_config.features.mcp.enabled:
        raise HTTPException(400, "This app does not support MCP.")


async def connect_mcp(payload: ConnectMCPRequest, user: Any = SIGNED_IN) -> Any:
    mcp_enabled()
    live_session(payload.sessionId)
    return await chainlit_server.connect_mcp(payload, user)


async def disconnect_mcp(payload: DisconnectMCPRequest, user: Any = SIGNED_IN) -> Any:
    mcp_enabled()
    live_session(payload.sessionId)
    return await chainlit_server.disconnect_mcp(payload, user)


# What a served file's response says, whatever type its uploader chose: download it, never sniff it
# into something else, and run nothing of it even where a browser would show it.
DOWNLOAD_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": "sandbox; default-src 'none'",
}


def attachment(name: str) -> str:
    """A Content-Disposition that downloads the file under `name` (quoted safely, UTF-8 kept)."""
    name = name or "file"
    plain = "".join(c if c.isascii() and c.isprintable() and c not in '"\\' else "_" for c in name)
    return f"attachment; filename=\"{plain or 'file'}\"; filename*=UTF-8''{quote(name, safe='')}"


async def download_file(file_id: str, session_id: str, user: Any = SIGNED_IN) -> Response:
    response = await chainlit_server.get_file(file_id, session_id, user)
    if isinstance(response, FileResponse) and not Path(response.path).is_file():
        raise HTTPException(404, "File not found")  # an upload its turn read and deleted (a 500 in Chainlit)
    session = WebsocketSession.get_by_id(session_id)
    name = str((session.files.get(file_id) or {}).get("name") or "file") if session else "file"
    response.headers.update({**DOWNLOAD_HEADERS, "Content-Disposition": attachment(name)})
    return response


def install_session_routes(app: FastAPI) -> None:
    """Put the checked versions of the element, action, MCP and file routes in front of Chainlit's."""
    before = len(app.router.routes)
    for path, endpoint, method in (
        ("/project/element", update_element, "PUT"),
        ("/project/element", delete_element, "DELETE"),
        ("/project/action", call_action, "POST"),
        ("/mcp", connect_mcp, "POST"),
        ("/mcp", disconnect_mcp, "DELETE"),
        ("/project/file/{file_id}", download_file, "GET"),
    ):
        app.add_api_route(path, endpoint, methods=[method], include_in_schema=False)
    move_to_front(app, app.router.routes[before:])
