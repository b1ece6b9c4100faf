"""The OpenAI-compatible API (/v1) fuzzed from its own schema, against the real server.

The schema is vLLM's: the FastAPI app of services/api/server.py holds vLLM's route functions for the
paths we serve (SERVED_PATHS), and its OpenAPI document is built here at test time, offline, so it is
always the installed vLLM's. It is narrowed to what our gate accepts (no parameters beyond vLLM's, no
`priority`), then Schemathesis draws requests that follow it and requests that break it. Hypothesis
adds the bodies no schema describes: JSON nested past any parser's depth, bytes that are not UTF-8,
JSON that is not an object, numbers past float range, other content types.

Every answer must be below 500, a 4xx in OpenAI's error shape; the server's log must hold no
traceback, and no URL named in a request may be fetched (each points at a loopback listener).
"""

from __future__ import annotations

import copy
import http.client
import json
import re
import socket
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import example, given
from hypothesis import strategies as st
from schemathesis import GenerationMode

from harness.server import AppServer
from services.api.server import SERVED_PATHS, build_api_app
from tests.system.security.conftest import Intact, accounts
from tests.system.security.fuzzing import Deep, fuzz_settings, hostile_value

URL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")
MAX_ANSWER_TOKENS = 4  # a drawn max_tokens of thousands would only make the run slow
TOKEN_LIMITS = ("max_tokens", "max_completion_tokens", "min_tokens")


def served_schema() -> dict[str, Any]:
    """vLLM's OpenAPI document for SERVED_PATHS, narrowed to what our gate lets through."""
    schema = copy.deepcopy(build_api_app().openapi())
    assert sorted(schema["paths"]) == sorted(SERVED_PATHS)
    for name in ("ChatCompletionRequest", "CompletionRequest"):
        model = schema["components"]["schemas"][name]
        model["additionalProperties"] = False  # checks.py refuses parameters vLLM does not know
        model["properties"].pop("priority", None)  # set by the service, refused from callers
    return schema


class Listener:
    """A loopback TCP server that counts connections: a request's URLs all point here."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}/fetched.png"
        self.connections = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self.server.accept()
            except OSError:
                return
            self.connections += 1
            connection.close()


@pytest.fixture(scope="module")
def listener() -> Iterator[Listener]:
    heard = Listener()
    yield heard
    heard.server.close()


@pytest.fixture(scope="module")
def api_key(target: AppServer) -> str:
    name = f"apifuzzer{uuid.uuid4().hex[:8]}"
    accounts(target.env["DATA_DIR"], "add", name, stdin="apifuzzer-password-1\n")
    return accounts(target.env["DATA_DIR"], "key", "create", name).stdout.split()[0]


@pytest.fixture(scope="module")
def api_schema() -> schemathesis.BaseSchema:
    return schemathesis.openapi.from_dict(served_schema(), config=schemathesis.Config())


def tamed_body(body: dict[str, Any], listener: Listener) -> dict[str, Any]:
    """A drawn body made cheap and harmless: answers capped (vLLM's default for chat is the whole
    context), every URL pointing at `listener`."""
    if not any(key in body for key in TOKEN_LIMITS[:2]):
        body = {**body, "max_tokens": MAX_ANSWER_TOKENS}
    return tamed(body, listener)


def tamed(value: Any, listener: Listener) -> Any:
    """`value` with every URL pointing at `listener` and answer lengths capped."""
    if isinstance(value, str):
        return listener.url if URL.match(value) else value
    if isinstance(value, list):
        return [tamed(item, listener) for item in value]
    if isinstance(value, dict):
        return {
            key: MAX_ANSWER_TOKENS
            if key in TOKEN_LIMITS and isinstance(item, int) and item > MAX_ANSWER_TOKENS
            else tamed(item, listener)
            for key, item in value.items()
        }
    return value


def error_shape_problem(status: int, body: bytes) -> str | None:
    """Why a 4xx body is not OpenAI's error shape ({"error": {"message", "type", "param", "code"}})."""
    try:
        error = json.loads(body)["error"]
    except (ValueError, KeyError, TypeError):
        return f"{status} without an OpenAI error object: {body[:300]!r}"
    if not isinstance(error, dict) or not isinstance(error.get("message"), str):
        return f"{status} error without a message: {body[:300]!r}"
    if not isinstance(error.get("type"), str) or not isinstance(error.get("code"), str | None):
        return f"{status} error with a wrong type or code: {body[:300]!r}"
    return None


def answer_problems(status: int, body: bytes) -> list[str]:
    if status >= 500:
        return [f"{status}: {body[:500]!r}"]
    if 400 <= status < 500:
        return [problem] if (problem := error_shape_problem(status, body)) else []
    return []


OPERATIONS = [
    ("POST", "/v1/chat/completions", GenerationMode.POSITIVE),
    ("POST", "/v1/chat/completions", GenerationMode.NEGATIVE),
    ("POST", "/v1/completions", GenerationMode.POSITIVE),
    ("POST", "/v1/completions", GenerationMode.NEGATIVE),
    ("GET", "/v1/models", GenerationMode.POSITIVE),
]


@pytest.mark.fuzz  # Hypothesis draws inside the test: its examples come from the profile too
@pytest.mark.parametrize(("method", "path", "mode"), OPERATIONS)
def test_schema_drawn_requests_get_no_server_error(
    target: AppServer,
    api_key: str,
    api_schema: schemathesis.BaseSchema,
    listener: Listener,
    intact: Intact,
    method: str,
    path: str,
    mode: GenerationMode,
) -> None:
    cases = api_schema[path][method].as_strategy(generation_mode=mode)

    @fuzz_settings()
    @given(case=cases)
    def one_request(case: schemathesis.Case) -> None:
        if isinstance(case.body, dict):
            case.body = tamed_body(case.body, listener)
        elif isinstance(case.body, list):
            case.body = tamed(case.body, listener)
        mark = intact.mark()
        heard = listener.connections
        response = case.call(base_url=target.base_url, headers={"Authorization": f"Bearer {api_key}"},
                             timeout=60)  # fmt: skip
        shown = f"{method} {path} body {json.dumps(case.body, default=repr)[:400]}"
        assert not answer_problems(response.status_code, response.content), (shown, response.content[:500])
        assert listener.connections == heard, f"the server fetched a URL named in {shown}"
        assert not intact.problems(mark), (shown, intact.problems(mark))

    one_request()


# --- bodies no schema describes ------------------------------------------------------------------

CHAT = {"model": "tiny-llama", "messages": [{"role": "user", "content": "Hi."}], "max_tokens": 2}
raw_bodies = st.one_of(
    st.just(Deep(64)),
    st.binary(max_size=100),
    st.sampled_from(
        (
            b"",
            b"{",
            b"null",
            b"[]",
            b'"text"',
            b"1e400",
            b'{"messages": NaN}',
            b"\xff\xfe\x00{}",
            b'{"model": "x", "model": "y", "messages": []}',
            b'{"messages": [{"role": "user", "content": "\\ud800"}]}',
            b'{"messages": [{"role": "user", "content": "Hi."}], "max_tokens": 1e400}',
        )
    ),
    hostile_value.map(lambda value: json.dumps(value).encode()),
    st.fixed_dictionaries({}, optional={key: hostile_value for key in CHAT}).map(
        lambda v: json.dumps(v).encode()
    ),
)
content_types = st.sampled_from(("application/json", "text/plain", "application/x-www-form-urlencoded", None))


def post(server: AppServer, path: str, body: bytes, content_type: str | None, key: str) -> tuple[int, bytes]:
    headers = {"Authorization": f"Bearer {key}", **({"Content-Type": content_type} if content_type else {})}
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    try:
        connection.request("POST", path, body=body, headers=headers)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


# A seed vLLM's engine cannot serialize (msgpack carries 64 bits): it answered 500 with a traceback.
PAST_64_BITS = json.dumps({"messages": [{"role": "user", "content": "Hi."}], "seed": 2**70}).encode()


@fuzz_settings()
@given(path=st.sampled_from(("/v1/chat/completions", "/v1/completions")), body=raw_bodies,
       content_type=content_types)  # fmt: skip
@example(path="/v1/chat/completions", body=b'{"messages": [{"role": "user", "content": "\\ud800"}]}',
         content_type="application/json")  # fmt: skip
@example(path="/v1/chat/completions", body=b'{"messages": []}', content_type="application/json")
@example(path="/v1/chat/completions", body=PAST_64_BITS, content_type="application/json")
@example(path="/v1/completions", content_type="application/json",
         body=b'{"prompt": "Hi.", "max_tokens": 2, "temperature": NaN}')  # fmt: skip
def test_raw_bodies_get_no_server_error(
    target: AppServer, api_key: str, intact: Intact, path: str, body: Any, content_type: str | None
) -> None:
    data = body.text.encode() if isinstance(body, Deep) else body
    mark = intact.mark()
    status, answer = post(target, path, data, content_type, api_key)
    shown = f"POST {path} ({content_type}) body {data[:200]!r}{' ...' if len(data) > 200 else ''}"
    assert not answer_problems(status, answer), (shown, status, answer[:500])
    assert not intact.problems(mark), (shown, intact.problems(mark))


@pytest.mark.parametrize(
    ("path", "depth"), [("/v1/chat/completions", 50_000), ("/v1/completions", 1_000)]
)  # one path each: far past Python's parser, and near where it gives up
def test_deeply_nested_json_gets_a_clean_answer(
    target: AppServer, api_key: str, intact: Intact, path: str, depth: int
) -> None:
    """JSON nested past what a parser takes (Python's gives up near 1,000 levels) is a client error,
    with no traceback in the server's log. Every depth of NESTING_DEPTHS on both paths is a unit
    test: tests/unit/security/test_edge_rules.py::test_deeply_nested_api_bodies_are_a_clean_400."""
    mark = intact.mark()
    status, answer = post(target, path, Deep(depth).text.encode(), "application/json", api_key)
    assert not answer_problems(status, answer), (
        f"POST {path}, JSON {depth} levels deep",
        status,
        answer[:300],
    )
    assert not intact.problems(mark), (f"POST {path}, JSON {depth} levels deep", intact.problems(mark))
