"""Everything the app puts between a client and Chainlit, in one place and in its order.

Routes first (ours in front of Chainlit's catch-all page), then the middleware from the inside out:
each `add_middleware` wraps the ones before it, so the last one added sees a request first. From the
outside in, a request meets: the safety headers (every response, refusals included), the body limit
(no body over its limit reaches anything else), the client's address (the TCP peer kept; a
forwarded address only from a trusted proxy), local mode's "this machine's browser only", the JSON
depth bound, writes only from the app's own page (same_origin_writes.py), the Origin policy (CORS),
the session-id check, then the upload guards (size, the wait for the page, the unsent-upload bounds)
and Chainlit.
The socket's handlers are wrapped the same way: message checks, JSON depth, session ids, Origin.
"""

from __future__ import annotations

from typing import Any

from services.accounts.sign_in import SignIn
from services.admin.routes import install_admin
from services.api.checks import MAX_JSON_DEPTH
from services.audit.log_lines import install_one_line_logs
from services.chat.store import CHAT_SETTING_KINDS
from services.runtime import Runtime
from services.web.access import install_access_guards
from services.web.body_limit import install_body_limit, limits_by_route
from services.web.chainlit_state import page_connected, tell_uploader
from services.web.chat_events import ChatEvents
from services.web.client_ids import install_client_id_guards
from services.web.headers import SecurityHeaders
from services.web.http_errors import install_http_errors
from services.web.json_bodies import JsonBodyGuard, bound_socket_messages
from services.web.local_access import install_local_access
from services.web.origins import OriginPolicy, install_origin_policy
from services.web.page_assets import install_page_assets
from services.web.peers import install_client_addresses
from services.web.routes import install_api, install_routes, remove_api_docs
from services.web.same_origin_writes import SameOriginWrites
from services.web.session_routes import install_session_routes
from services.web.socket_events import guard_socket_events
from services.web.socket_guard import install_socket_guard, socket_guard_for
from services.web.stored_text import install_name_cap
from services.web.transfer_routes import install_transfer_routes, with_import_limit
from services.web.upload_bounds import ChainlitUploads, install_unsent_upload_bounds
from services.web.upload_guard import DEFAULT_UPLOAD_PATH, UPLOAD_LINGER_SECONDS, install_upload_guard


def _install_app_routes(http_app: Any, runtime: Runtime, origins: OriginPolicy) -> None:
    """The app's own routes (ahead of Chainlit's page route), error pages and the name cap."""
    remove_api_docs(http_app)
    install_routes(http_app, runtime)
    install_admin(http_app, runtime, origins)
    install_transfer_routes(http_app, runtime)
    install_api(http_app, runtime)
    install_access_guards(http_app, runtime)
    install_session_routes(http_app)
    install_page_assets(http_app, runtime.settings.content_security_policy)
    install_http_errors(http_app)
    install_name_cap(http_app)


def _install_body_limit(http_app: Any, runtime: Runtime) -> None:
    """The body limit by route: socket.io polling and imports their own, uploads and /v1 left to
    their own guards, everything else MAX_REQUEST_BODY_BYTES."""
    settings = runtime.settings
    limits = limits_by_route(
        settings.max_request_body_bytes,
        settings.socket_max_event_bytes,
        DEFAULT_UPLOAD_PATH,
        api_served=runtime.api is not None,
    )
    limits = with_import_limit(limits, settings.import_max_bytes)
    install_body_limit(http_app, limits, linger_seconds=UPLOAD_LINGER_SECONDS)


def install_edge(
    http_app: Any,
    runtime: Runtime,
    sign_in: SignIn,
    origins: OriginPolicy,
    chainlit_url: str,
    chat: ChatEvents,
    uploads: ChainlitUploads,
) -> None:
    """Install the app's routes, guards and socket checks on Chainlit's FastAPI app (at import time);
    `chat` handles the chat events the socket guard hands on (an edited message); `uploads` holds the
    uploads not yet sent (its sweep is one of the runtime's maintenance steps)."""
    settings = runtime.settings
    install_one_line_logs()  # a client's text never starts a line of the server's log
    _install_app_routes(http_app, runtime, origins)
    install_socket_guard(
        socket_guard_for(runtime, sign_in.mode != "local", CHAT_SETTING_KINDS, chat.edit, uploads),
        settings.socket_max_event_bytes,
    )
    guard_socket_events()  # replaces Engine.IO's message handler: the depth bound wraps it after
    bound_socket_messages(MAX_JSON_DEPTH)
    install_unsent_upload_bounds(http_app, uploads)
    install_upload_guard(
        http_app,
        settings.max_upload_bytes,
        session_exists=page_connected,
        on_reject=tell_uploader,
    )
    install_client_id_guards(http_app)
    install_origin_policy(http_app, origins)
    http_app.add_middleware(SameOriginWrites, origins=origins)
    http_app.add_middleware(
        JsonBodyGuard, max_body_bytes=settings.max_request_body_bytes, max_depth=MAX_JSON_DEPTH
    )
    install_local_access(http_app, sign_in)
    install_client_addresses(http_app, settings, sign_in.mode)
    _install_body_limit(http_app, runtime)
    http_app.add_middleware(
        SecurityHeaders, content_security_policy=settings.content_security_policy, chainlit_url=chainlit_url
    )
