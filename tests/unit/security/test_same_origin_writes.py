"""Writes only from the app's own page: the rule's cases, and a walk over Chainlit's whole route table
so that a state-changing route an upgrade adds is either refused from another site or named, with
its reason, in EXEMPT_WRITES."""

from __future__ import annotations

import re
import uuid

import httpx
import pytest
from chainlit.server import app as chainlit_app
from starlette.routing import Mount

from services.web.origins import origin_policy
from services.web.same_origin_writes import (
    EXEMPT_WRITES,
    WRITE_METHODS,
    SameOriginWrites,
    is_exempt,
    write_refusal,
)

OWN = "http://127.0.0.1:8000"
POLICY = origin_policy("127.0.0.1", 8000, "", "https://widget.example.org")
HERE = {"host": "127.0.0.1:8000"}


def refused(method: str, path: str, **headers: str) -> bool:
    return write_refusal(method, path, {**HERE, **headers}, POLICY) is not None


WRITTEN_PATHS = ["/login", "/logout", "/auth/header", "/auth/jwt", "/project/file", "/conversations/import",
                 "/admin/accounts/add", "/anything/new"]  # fmt: skip


@pytest.mark.parametrize("path", WRITTEN_PATHS)
def test_a_write_from_another_sites_page_is_refused(path: str) -> None:
    for origin in ("https://evil.example", "null", "http://127.0.0.1.evil.example", "http://localhost:1", ""):
        assert refused("POST", path, origin=origin), origin
    for site in ("cross-site", "same-site", "none", "garbage"):
        assert refused("POST", path, **{"sec-fetch-site": site}), site
    assert refused("PUT", path, origin="https://evil.example")
    assert refused("patch", path, origin="https://evil.example")
    assert refused("DELETE", path, origin="https://evil.example")


def test_writes_from_the_apps_own_page_and_from_clients_that_are_not_browsers_pass() -> None:
    for origin in (OWN, "http://localhost:8000", "http://[::1]:8000", "https://widget.example.org"):
        assert not refused("POST", "/login", origin=origin), origin
    assert not refused("POST", "/login", **{"sec-fetch-site": "same-origin"})
    assert not refused("POST", "/login"), "no Origin, no Sec-Fetch-Site: a script, the harness"
    # Origin decides when both are sent: a browser's own word about the page
    assert refused("POST", "/login", origin="https://evil.example", **{"sec-fetch-site": "same-origin"})


def test_reading_is_never_refused() -> None:
    for method in ("GET", "HEAD", "OPTIONS"):
        assert not refused(method, "/login", origin="https://evil.example")


def test_only_the_api_is_exempt_and_only_under_its_own_path() -> None:
    assert set(EXEMPT_WRITES) == {"/v1"}
    assert not refused("POST", "/v1/chat/completions", origin="https://evil.example")
    assert not refused("POST", "/v1", origin="https://evil.example")
    assert refused("POST", "/v10/chat", origin="https://evil.example")
    assert refused("POST", "/v1x", origin="https://evil.example")


def chainlit_writes() -> list[tuple[str, str]]:
    """Every (method, concrete path) of a write in Chainlit's route table; a mount takes every method."""
    writes = []
    for route in chainlit_app.routes:
        methods = (
            set(WRITE_METHODS) if isinstance(route, Mount) else set(getattr(route, "methods", None) or ())
        )
        path = re.sub(r"\{[^}]*\}", str(uuid.uuid4()), getattr(route, "path", ""))
        writes += [
            (method, path + ("/" if isinstance(route, Mount) else "")) for method in methods & WRITE_METHODS
        ]
    return sorted(set(writes))


@pytest.mark.asyncio
async def test_every_write_route_of_chainlit_is_refused_from_another_site() -> None:
    """Through the middleware, in front of a stand-in for Chainlit's app that says it was reached."""

    async def reached(scope, receive, send) -> None:
        await send({"type": "http.response.start", "status": 299, "headers": []})
        await send({"type": "http.response.body", "body": b"reached"})

    writes = chainlit_writes()
    expected = {("POST", "/login"), ("POST", "/logout"), ("POST", "/auth/jwt"), ("POST", "/auth/header"),
                ("PUT", "/project/thread"), ("POST", "/ws/socket.io/")}  # fmt: skip
    assert expected <= set(writes), "the walk sees Chainlit's sign-in, project and socket routes"
    assert not [path for _, path in writes if is_exempt(path)], "a Chainlit route under an exempt path"
    guarded = SameOriginWrites(reached, POLICY)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=guarded), base_url=OWN) as http:
        for method, path in writes:
            foreign = await http.request(method, path, headers={"Origin": "https://evil.example"})
            cross = await http.request(method, path, headers={"Sec-Fetch-Site": "cross-site"})
            own = await http.request(method, path, headers={"Origin": OWN})
            script = await http.request(method, path)
            answers = [r.status_code for r in (foreign, cross, own, script)]
            assert answers == [403, 403, 299, 299], (method, path, answers)
        login = await http.post("/login", data={"username": "x"}, headers={"Origin": "https://evil.example"})
    assert "own page" in login.json()["detail"] and "set-cookie" not in login.headers
