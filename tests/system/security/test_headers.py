"""Every response carries the browser's safety headers (no framing, no sniffing, no referrer to other
sites, a Content-Security-Policy that still lets Chainlit's page run), and the sign-in cookie is
`Secure` when the page was served over https (a trusted proxy's X-Forwarded-Proto)."""

from __future__ import annotations

import base64
import hashlib
import re

import httpx
import pytest

from harness.chat_client import ChatClient
from harness.server import AppServer
from tests.system.security.conftest import ALICE

in_loop = pytest.mark.asyncio(loop_scope="package")


def assert_safety_headers(response: httpx.Response) -> None:
    where = f"{response.request.method} {response.request.url.path} ({response.status_code})"
    headers = response.headers
    policy = headers.get("content-security-policy", "")
    assert "frame-ancestors 'none'" in policy, where
    assert "default-src 'self'" in policy and "object-src 'none'" in policy, where
    assert headers.get("x-frame-options") == "DENY", where
    assert headers.get("x-content-type-options") == "nosniff", where
    assert headers.get("referrer-policy") in ("same-origin", "no-referrer"), where


@in_loop
async def test_the_page_api_assets_and_errors_carry_the_safety_headers(target: AppServer) -> None:
    async with httpx.AsyncClient(base_url=target.base_url, timeout=30) as http:
        page = await http.get("/")
        script = re.search(r'src="(/assets/index-[^"]+\.js)"', page.text)
        assert script, page.text[:500]
        responses = [
            page,
            await http.get("/login"),
            await http.get(script.group(1)),
            await http.get("/vendor/inter/400.css"),
            await http.get("/favicon"),
            await http.get("/auth/config"),
            await http.get("/no/such/page"),  # the page again (Chainlit's catch-all route)
            await http.post("/project/threads", json={}),  # 401: not signed in
            await http.get("/v1/models"),  # 401: no API key
            await http.get("/healthz"),
            await http.get("/status"),  # 401: no OPS_TOKEN
            await http.post("/login", data={"username": ALICE[0], "password": ALICE[1]}),
        ]
    for response in responses:
        assert_safety_headers(response)


@in_loop
async def test_the_pages_own_inline_scripts_are_allowed_and_nothing_else_inline(target: AppServer) -> None:
    async with httpx.AsyncClient(base_url=target.base_url) as http:
        page = await http.get("/")
    policy = page.headers["content-security-policy"]
    script_src = next(d for d in policy.split(";") if d.strip().startswith("script-src")).split()
    assert "'unsafe-inline'" not in script_src and "'unsafe-eval'" not in script_src
    inline = re.findall(r"<script>(.*?)</script>", page.text, flags=re.DOTALL)
    assert inline, "Chainlit's page has inline scripts (its JS injection)"
    for body in inline:
        digest = base64.b64encode(hashlib.sha256(body.encode()).digest()).decode()
        assert f"'sha256-{digest}'" in script_src, body


@in_loop
async def test_the_cookie_is_secure_when_a_trusted_proxy_says_https(target: AppServer) -> None:
    form = {"username": ALICE[0], "password": ALICE[1]}
    async with httpx.AsyncClient(base_url=target.base_url) as http:
        proxied = await http.post("/login", data=form, headers={"X-Forwarded-Proto": "https"})
        plain = await http.post("/login", data=form)
    assert proxied.status_code == plain.status_code == 200
    cookie = proxied.headers.get_list("set-cookie")
    assert cookie and all("; secure" in c.lower() for c in cookie), cookie
    assert "secure" not in plain.headers["set-cookie"].lower(), "plain http on loopback keeps working"


@in_loop
async def test_an_uploaded_page_is_served_as_a_download_that_runs_nothing(target: AppServer) -> None:
    """Chainlit serves an upload with the type its uploader chose, inline: an HTML file would run its
    script on the app's origin."""
    alice = ChatClient(target.base_url, *ALICE)
    await alice.connect()
    try:
        page = b"<html><script>fetch('/user').then(r => r.text()).then(alert)</script></html>"
        file_id = await alice.upload("report «final».html", page, "text/html")
        served = await alice.http("GET", f"/project/file/{file_id}", params={"session_id": alice.session_id})
    finally:
        await alice.close()
    assert served.status_code == 200 and served.content == page, served.status_code
    disposition = served.headers.get("content-disposition", "")
    assert disposition.startswith("attachment;") and "filename*=UTF-8''report%20%C2%ABfinal%C2%BB.html" in (
        disposition
    ), disposition
    assert served.headers.get("x-content-type-options") == "nosniff"
    assert "sandbox" in served.headers.get("content-security-policy", ""), served.headers
