"""Hostile HTTP requests, drawn by Hypothesis, against the real server's routes (Chainlit's REST
routes the page uses, sign-in, files, our operators' routes): hostile ids in paths (plain,
percent-encoded, double-encoded, with `..` left for the server to resolve), queries, JSON bodies of
any type, size, depth and encoding, other content types; as Alice, as nobody, or with a forged
cookie or token.

After every request: no 5xx, nothing of Bob's in the response, and the server answers, its log has
no traceback, nothing outside its folders changed and Bob's conversation is as it was.
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlencode

import pytest
import socketio
from hypothesis import example, given
from hypothesis import strategies as st

from harness.chat_client import SOCKET_PATH, client_headers, handshake, new_address
from harness.server import AppServer
from harness.waiting import WAIT_SECONDS
from tests.system.security.conftest import BobsConversation, Intact
from tests.system.security.fuzzing import (
    NESTING_DEPTHS,
    Deep,
    Victims,
    fuzz_settings,
    hostile_id,
    hostile_text,
    hostile_value,
    render,
    sometimes,
)


@dataclass(frozen=True)
class Route:
    """One route as the page calls it: the path (with {params}), its query and its JSON body."""

    method: str
    path: str
    query: dict[str, Any] = field(default_factory=dict)
    body: Any = None
    form: dict[str, str] | None = None
    upload: bool = False


CUSTOM_ELEMENT = {"type": "custom", "id": "{new_uuid}", "name": "n", "display": "inline", "props": {}}
FEEDBACK = {"forId": "{bob_step}", "value": 1, "comment": "good"}
ROUTES = (
    Route("POST", "/project/threads", body={"pagination": {"first": 20, "cursor": None}, "filter": {}}),
    Route("GET", "/project/thread/{id}"),
    Route("GET", "/project/thread/{id}/element/{element}"),
    Route("PUT", "/project/thread", body={"threadId": "{bob_thread}", "name": "Mine now"}),
    Route("DELETE", "/project/thread", body={"threadId": "{bob_thread}"}),
    Route("PUT", "/project/thread/share", body={"threadId": "{bob_thread}", "isShared": True}),
    Route("GET", "/project/share/{id}"),
    Route("PUT", "/feedback", body={"sessionId": "{alice_session}", "feedback": FEEDBACK}),
    Route("DELETE", "/feedback", body={"feedbackId": "{new_uuid}"}),
    Route("PUT", "/project/element", body={"sessionId": "{alice_session}", "element": CUSTOM_ELEMENT}),
    Route("DELETE", "/project/element", body={"sessionId": "{alice_session}", "element": CUSTOM_ELEMENT}),
    Route(
        "POST",
        "/project/action",
        body={"sessionId": "{alice_session}", "action": {"name": "x", "payload": {}}},
    ),
    Route("POST", "/project/file", query={"session_id": "{alice_session}"}, upload=True),
    Route("GET", "/project/file/{id}", query={"session_id": "{alice_session}"}),
    Route("POST", "/set-session-cookie", body={"session_id": "{alice_session}"}),
    Route(
        "POST",
        "/mcp",
        body={"sessionId": "{alice_session}", "name": "x", "clientType": "stdio", "fullCommand": "true"},
    ),
    Route("DELETE", "/mcp", body={"sessionId": "{alice_session}", "name": "x"}),
    Route("GET", "/user"),
    Route("GET", "/project/settings", query={"language": "en-US", "chat_profile": ""}),
    Route("GET", "/project/translations", query={"language": "en-US"}),
    Route("POST", "/auth/jwt"),
    Route("POST", "/auth/header"),
    Route("POST", "/login", form={"username": "nobody-here", "password": "not a password"}),
    Route("GET", "/auth/oauth/{id}"),
    Route("GET", "/auth/oauth/{id}/callback", query={"code": "x", "state": "y"}),
    Route("GET", "/avatars/{id}"),
    Route("GET", "/public/{id}"),
    Route("GET", "/assets/{id}"),
    Route("GET", "/copilot/{id}"),
    Route("GET", "/logo", query={"theme": "light"}),
    Route("GET", "/favicon"),
    Route("GET", "/{id}"),
    Route("GET", "/healthz"),
    Route("GET", "/status"),
    Route("GET", "/stats"),
)
# Percent-encodings of a path parameter: whole, keeping `/` and `.` (so `..` climbs), keeping `%`
# (so `%2e%2e` is decoded once by the server), and twice.
ENCODINGS = (
    lambda text: quote(text, safe="", errors="surrogatepass"),
    lambda text: quote(text, safe="/.", errors="surrogatepass"),
    lambda text: quote(text, safe="/.%", errors="surrogatepass"),
    lambda text: quote(quote(text, safe="", errors="surrogatepass"), safe=""),
)
CONTENT_TYPES = (
    "application/json", "application/json; charset=latin-1", "text/plain",
    "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", None,
)  # fmt: skip


def mutated(valid: Any) -> st.SearchStrategy:
    """The page's value, with any of its fields (at any depth) hostile, missing, or extra."""
    if not isinstance(valid, dict):
        return sometimes(valid, hostile_id if isinstance(valid, str) else hostile_value)
    fields = {key: mutated(value) for key, value in valid.items()}
    required, optional = dict(list(fields.items())[:1]), dict(list(fields.items())[1:])
    extra = st.dictionaries(hostile_text, hostile_value, max_size=2)
    return st.tuples(st.fixed_dictionaries(required, optional=optional), extra).map(
        lambda t: {**t[1], **t[0]}
    )


@dataclass
class Request:
    route: Route
    params: dict[str, Any]
    encoding: int
    query: dict[str, Any]
    body: Any  # a JSON value, Deep, bytes, or None
    content_type: str | None
    who: str  # "alice", "nobody", "forged"
    forged: str = ""


def bodies(route: Route) -> st.SearchStrategy:
    if route.body is None and route.form is None:
        return st.one_of(st.none(), hostile_value, st.binary(max_size=64))
    page = route.body if route.body is not None else route.form
    deep = st.sampled_from(NESTING_DEPTHS).map(Deep)
    raw = st.one_of(st.binary(max_size=200), st.just(b"\xff\xfe{"), st.just(b'{"a": "\\ud800"}'))
    return st.one_of(mutated(page), hostile_value, deep, raw)


def requests_for(route: Route) -> st.SearchStrategy:
    names = [part[1:-1] for part in route.path.split("/") if part.startswith("{")]
    return st.builds(
        Request,
        route=st.just(route),
        params=st.fixed_dictionaries({name: hostile_id for name in names}),
        encoding=st.integers(0, len(ENCODINGS) - 1),
        query=mutated(route.query) if route.query else st.just({}),
        body=bodies(route),
        content_type=st.sampled_from(CONTENT_TYPES),
        who=st.sampled_from(("alice", "alice", "nobody", "forged")),
        forged=hostile_text,
    )


requests = st.sampled_from(ROUTES).flatmap(requests_for)


@dataclass
class AlicesPage:
    """Alice's page, connected for the whole module: her session id names a live session."""

    cookie: str
    session_id: str
    sio: socketio.Client


@pytest.fixture(scope="module")
def alices_page(target: AppServer, alice_cookie: str) -> Iterator[AlicesPage]:
    session_id = str(uuid.uuid4())
    sio = socketio.Client(reconnection=False)
    headers = client_headers(new_address(), alice_cookie)
    sio.connect(target.base_url, socketio_path=SOCKET_PATH, transports=["websocket"],
                auth=handshake(session_id), headers=headers, wait_timeout=10)  # fmt: skip
    sio.emit("connection_successful")
    yield AlicesPage(alice_cookie, session_id, sio)
    sio.call("clear_session", timeout=WAIT_SECONDS)  # acknowledged late on a busy machine
    sio.disconnect()


def encoded_body(request: Request) -> bytes | None:
    body = request.body
    if body is None:
        return None
    if isinstance(body, bytes):
        return body
    if isinstance(body, Deep):
        return body.text.encode()
    if request.route.upload and isinstance(body, dict):
        return multipart(body)
    if request.route.form is not None and isinstance(body, dict):
        return urlencode({str(k): str(v) for k, v in body.items()}).encode("utf-8", "surrogatepass")
    return json.dumps(body).encode()  # ensure_ascii: lone surrogates go as \\ud800 escapes


def multipart(fields: dict[str, Any]) -> bytes:
    """A multipart body with one file, named by the hostile values drawn."""
    name = str(fields.get("name", fields.get("filename", "notes.txt")))
    head = f'--x\r\nContent-Disposition: form-data; name="file"; filename="{name}"\r\n'
    return (head + "Content-Type: text/plain\r\n\r\nhello\r\n--x--\r\n").encode("utf-8", "surrogatepass")


def send(server: AppServer, request: Request, cookie: str) -> tuple[int, bytes, str]:
    """Send `request` as raw HTTP/1.1 (paths are sent as given: no client resolves `..`)."""
    path = request.route.path
    for name, value in request.params.items():
        path = path.replace("{" + name + "}", ENCODINGS[request.encoding](str(value)))
    query = urlencode(
        {str(k): str(v) for k, v in request.query.items()}, encoding="utf-8", errors="surrogatepass"
    )
    target_path = path + (f"?{query}" if query else "")
    headers = {"X-Forwarded-For": new_address()}
    if request.who == "alice":
        headers["Cookie"] = cookie
    elif request.who == "forged":
        forged = quote(request.forged, safe="", errors="surrogatepass")
        headers["Cookie"], headers["Authorization"] = f"access_token={forged}", f"Bearer {forged}"
    body = encoded_body(request)
    if request.route.upload and body is not None:
        headers["Content-Type"] = "multipart/form-data; boundary=x"
    elif request.content_type and body is not None:
        headers["Content-Type"] = request.content_type
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        connection.request(request.route.method, target_path, body=body, headers=headers)
        response = connection.getresponse()
        return response.status, response.read(), target_path
    finally:
        connection.close()


def leaks(response: bytes, sent: str, bob: BobsConversation) -> list[str]:
    """Bob's secret, or Bob's ids that the request did not itself carry, found in the response."""
    text = response.decode(errors="replace")
    found = [bob.secret] if bob.secret in text else []
    return found + [
        bob_id for bob_id in [bob.thread_id, *bob.step_ids] if bob_id in text and bob_id not in sent
    ]


@fuzz_settings()
@given(request=requests)
@example(request=Request(ROUTES[3], {}, 0, {}, {"threadId": "{bob_thread}", "name": "Mine"}, None, "alice"))
@example(request=Request(ROUTES[0], {}, 0, {}, Deep(50_000), "application/json", "alice"))
@example(request=Request(ROUTES[1], {"id": "../../../../{canary_rel}"}, 1, {}, None, None, "alice"))
def test_any_request_gets_no_server_error_and_nothing_of_bobs(
    target: AppServer,
    victims: Victims,
    intact: Intact,
    bob: BobsConversation,
    alices_page: AlicesPage,
    request: Request,
) -> None:
    names = dataclasses.replace(victims, alice_session=alices_page.session_id)
    drawn = dataclasses.replace(
        request, params=render(request.params, names), query=render(request.query, names),
        body=render(request.body, names), forged=render(request.forged, names),
    )  # fmt: skip
    mark = intact.mark()
    status, response, sent = send(target, drawn, alices_page.cookie)
    shown = f"{drawn.route.method} {sent[:200]} as {drawn.who}, body {repr(drawn.body)[:200]}"
    assert status < 500, (shown, status, response[:500])
    assert not leaks(response, sent + repr(drawn.body), bob), (shown, response[:500])
    assert not intact.problems(mark), (shown, intact.problems(mark))
