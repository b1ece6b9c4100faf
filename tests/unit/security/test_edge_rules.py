"""The edge's rules as pure logic: which origins are the app's own, how the safety headers and the
Secure flag are added, how deep a JSON body may nest, who may read the operators' routes."""

from __future__ import annotations

import base64
import hashlib
import json

import httpx
import pytest
from fastapi import FastAPI
from fastapi.responses import PlainTextResponse

from services.api.checks import MAX_JSON_DEPTH, JsonTooDeep, check_request, parse_body, parse_json
from services.api.errors import ApiError
from services.config import Settings, SettingsError
from services.observability.ops_access import operator_refusal, require_ops_token
from services.web.headers import SecurityHeaders, page_policy, secure_cookie
from services.web.origins import OriginPolicy, origin_policy
from services.web.routes import remove_api_docs
from services.web.session_routes import attachment
from tests.system.security.fuzzing import NESTING_DEPTHS, Deep

DEEP = b"[" * 100_000 + b"]" * 100_000


def test_the_own_origin_is_chainlit_url_when_set() -> None:
    policy = origin_policy("127.0.0.1", 8000, "https://chat.example.com/app/", "")
    assert policy.allows("https://chat.example.com", host="chat.example.com")
    assert policy.allows("HTTPS://Chat.Example.com:443", host="anything")
    assert not policy.allows("http://127.0.0.1:8000", host="127.0.0.1:8000")
    assert not policy.allows("http://chat.example.com", host="chat.example.com"), "another scheme"


def test_a_loopback_bind_allows_its_loopback_names_and_the_page_of_the_host_it_asks() -> None:
    policy = origin_policy("127.0.0.1", 8000, "", "https://widget.example.org")
    for origin in ("http://127.0.0.1:8000", "http://localhost:8000", "http://[::1]:8000",
                   "https://widget.example.org"):  # fmt: skip
        assert policy.allows(origin, host="127.0.0.1:8000"), origin
    assert not policy.allows("http://127.0.0.1:8001", host="127.0.0.1:8000")
    assert not policy.allows("https://evil.example", host="127.0.0.1:8000"), "another site's page"
    # A page under another name that resolves here (a tunnel signed in with the install's token, or
    # DNS rebinding) is its own origin: what it may do is decided by the sign-in its name holds (a
    # cookie is per name; local mode refuses foreign names without the token: test_local_mode.py).
    assert policy.allows("http://tunnel.example:8000", host="tunnel.example:8000")


def test_a_public_bind_without_chainlit_url_allows_the_same_host_only() -> None:
    policy = origin_policy("0.0.0.0", 8000, "", "")
    assert policy.allows("http://chat.internal:8000", host="chat.internal:8000")
    assert policy.allows("https://chat.example.com", host="chat.example.com:443")
    assert not policy.allows("https://evil.example", host="chat.example.com")
    assert not policy.allows("null", host="null")
    assert not OriginPolicy(frozenset(), same_host=True).allows("https://a.example", host=None)


async def cookie_of(app_scheme: str, chainlit_url: str) -> list[bytes]:
    """The Set-Cookie headers a response gets through the middleware (pure ASGI, no server)."""

    async def app(scope: dict, receive, send) -> None:
        headers = [(b"set-cookie", b"access_token=x; HttpOnly; Path=/; SameSite=lax")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b""})

    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    middleware = SecurityHeaders(app, "default-src 'self'", chainlit_url)
    await middleware({"type": "http", "scheme": app_scheme, "path": "/login", "headers": []}, None, send)
    return [value for name, value in sent[0]["headers"] if name == b"set-cookie"]


@pytest.mark.asyncio
async def test_chainlit_url_on_https_makes_every_cookie_secure() -> None:
    assert (await cookie_of("http", "https://chat.example.com"))[0].endswith(b"; Secure")
    assert (await cookie_of("https", ""))[0].endswith(b"; Secure")
    assert b"Secure" not in (await cookie_of("http", ""))[0]
    assert (await cookie_of("http", "http://chat.example.com")) == [
        b"access_token=x; HttpOnly; Path=/; SameSite=lax"
    ]


def test_secure_is_added_once() -> None:
    assert secure_cookie(b"a=b; Secure; HttpOnly") == b"a=b; Secure; HttpOnly"
    assert secure_cookie(b"a=b") == b"a=b; Secure"


def test_the_page_policy_adds_its_inline_script_hashes() -> None:
    html = "<script>const global = globalThis;</script><script type=module src=/a.js></script>"
    policy = page_policy("default-src 'self'; script-src 'self'; object-src 'none'", html)
    digest = base64.b64encode(hashlib.sha256(b"const global = globalThis;").digest()).decode()
    assert f"script-src 'self' 'sha256-{digest}';" in policy
    derived = page_policy("default-src 'self'", html)
    assert derived == f"default-src 'self'; script-src 'self' 'sha256-{digest}'", derived


def test_parse_json_bounds_the_nesting() -> None:
    assert parse_json(b'{"a": [1, {"b": [2]}]}', max_depth=4) == {"a": [1, {"b": [2]}]}
    with pytest.raises(JsonTooDeep):
        parse_json(b'{"a": [1, {"b": [2]}]}', max_depth=3)
    with pytest.raises(JsonTooDeep):
        parse_json(DEEP, max_depth=64)
    with pytest.raises(ValueError):
        parse_json(b"{not json", max_depth=64)
    assert parse_json(json.dumps([[]] * 10_000).encode(), max_depth=2) == [[]] * 10_000


@pytest.mark.parametrize("depth", NESTING_DEPTHS)
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_deeply_nested_api_bodies_are_a_clean_400(path: str, depth: int) -> None:
    """tests/system/security/test_fuzz_api.py's nested bodies, as the gate reads them (parse_body at
    MAX_JSON_DEPTH, then check_request for the path, with the default settings of its server): one
    at the bound parses and is no object; deeper ones, past Python's parser too, are too deep."""
    with pytest.raises(ApiError) as refused:
        check_request(path, parse_body(Deep(depth).text.encode(), MAX_JSON_DEPTH), Settings.from_env({}))
    error = json.loads(refused.value.body())["error"]
    assert refused.value.status == 400 and error["type"] == "invalid_request_error", error
    assert error["code"] == "invalid_json", error
    words = "must be a JSON object" if depth <= MAX_JSON_DEPTH else f"nested deeper than {MAX_JSON_DEPTH}"
    assert words in error["message"], error


def test_allowed_origins_must_be_origins() -> None:
    assert Settings.from_env({"ALLOWED_ORIGINS": "https://a.example, http://b.example:8080/"})
    for bad in ("*", "https://a.example/path", "a.example", "null"):
        with pytest.raises(SettingsError, match="ALLOWED_ORIGINS"):
            Settings.from_env({"ALLOWED_ORIGINS": bad})


def test_a_public_bind_needs_an_ops_token() -> None:
    plain = Settings.from_env({})
    require_ops_token(plain, "127.0.0.1")
    require_ops_token(plain, "::1")
    require_ops_token(Settings.from_env({"OPS_TOKEN": "t"}), "0.0.0.0")
    for host in ("0.0.0.0", "::", "10.0.0.5"):
        with pytest.raises(SettingsError, match="OPS_TOKEN"):
            require_ops_token(plain, host)


def test_operators_are_token_holders_or_direct_local_callers() -> None:
    assert operator_refusal("t", "Bearer t", "10.0.0.5", {}) is None
    assert operator_refusal("t", "Bearer wrong", "127.0.0.1", {})[0] == 401
    assert operator_refusal("t", "t", "127.0.0.1", {})[0] == 401
    assert operator_refusal("", "", "127.0.0.1", {}) is None
    assert operator_refusal("", "", "10.0.0.5", {})[0] == 403
    assert operator_refusal("", "", "127.0.0.1", {"x-forwarded-for": "10.0.0.5"})[0] == 403, "a local proxy"


@pytest.mark.parametrize(
    "body",
    [b'{"seed": 1180591620717411303424}', b'{"logit_bias": {"1": -99999999999999999999}}',
     b'{"temperature": NaN}', b'{"top_p": -Infinity}'],
)  # fmt: skip
def test_api_bodies_with_numbers_no_engine_can_carry_are_400(body: bytes) -> None:
    with pytest.raises(ApiError) as refused:
        parse_body(body, 64)
    assert refused.value.status == 400


def test_api_bodies_with_ordinary_numbers_pass() -> None:
    assert parse_body(b'{"seed": 9223372036854775807, "temperature": 0.7, "stream": true}', 64)["seed"] > 0


def test_a_served_file_is_a_download_under_its_own_name_quoted_safely() -> None:
    assert attachment("notes.html") == "attachment; filename=\"notes.html\"; filename*=UTF-8''notes.html"
    tricky = attachment('a"b\\c\r\nSet-Cookie: x=1;«é».svg')
    assert "\r" not in tricky and "\n" not in tricky and tricky.count('"') == 2, tricky
    assert tricky.startswith('attachment; filename="a_b_c__Set-Cookie: x=1;___.svg"'), tricky
    assert attachment("") == "attachment; filename=\"file\"; filename*=UTF-8''file"


@pytest.mark.asyncio
async def test_the_api_documentation_is_off_and_its_paths_are_any_unknown_path() -> None:
    """Chainlit's FastAPI app keeps FastAPI's /openapi.json, /docs and /redoc, open to anyone."""
    app = FastAPI()  # as Chainlit makes it: the documentation on, and a page for every other path
    app.get("/user")(lambda: {"me": 1})
    app.get("/{full_path:path}")(lambda full_path: PlainTextResponse("the chat page"))
    remove_api_docs(app)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://app") as http:
        for path in ("/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"):
            answer = await http.get(path)
            assert answer.text == "the chat page", (path, answer.text[:200])
        assert (await http.get("/user")).json() == {"me": 1}
    assert app.openapi_url is None and app.docs_url is None and app.redoc_url is None
