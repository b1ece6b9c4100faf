"""GitHub's OAuth and user API as Chainlit 2.12 and the app call them, served on a loopback port.

Chainlit's GitHub provider reads its three addresses from OAUTH_GITHUB_AUTH_URL, _TOKEN_URL and
_USER_INFO_URL (chainlit/oauth_providers.py), so a real `chainlit run` can sign people in against
this server: the test registers a person (login, e-mails, organisations) and gets the `code` GitHub
would hand the browser; `sign_in_with_github` then walks the browser's two requests.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx

COOKIE_NAME = "access_token"  # Chainlit's sign-in cookie


@dataclass
class GitHubPerson:
    """What GitHub knows of a person: the login, e-mails (address, verified) and org memberships."""

    login: str
    emails: list[tuple[str, bool]] = field(default_factory=list)
    orgs: dict[str, str] = field(default_factory=dict)  # organisation -> "active" | "pending"
    user_id: int = 0


class FakeGitHub:
    """A threaded HTTP server with GitHub's token, /user, /user/emails and org-membership routes."""

    def __init__(self) -> None:
        self.people: dict[str, GitHubPerson] = {}  # by access token
        self.requests: list[str] = []  # paths asked, in order
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self) -> FakeGitHub:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def env(self) -> dict[str, str]:
        """The variables that switch Chainlit's GitHub provider on and point it here."""
        return {
            "OAUTH_GITHUB_CLIENT_ID": "fake-client-id",
            "OAUTH_GITHUB_CLIENT_SECRET": "fake-client-secret",
            "OAUTH_GITHUB_AUTH_URL": f"{self.url}/login/oauth/authorize",
            "OAUTH_GITHUB_TOKEN_URL": f"{self.url}/login/oauth/access_token",
            "OAUTH_GITHUB_USER_INFO_URL": f"{self.url}/user",
        }

    def register(self, person: GitHubPerson) -> str:
        """Add `person`; return the authorization code GitHub would give their browser."""
        person.user_id = person.user_id or 1000 + len(self.people)
        self.people[f"token-{person.login}"] = person
        return f"code-{person.login}"

    def answer(self, method: str, path: str, token: str | None, body: bytes) -> tuple[int, Any]:
        """(status, JSON or form text) for one request."""
        self.requests.append(path)
        if method == "POST" and path == "/login/oauth/access_token":
            code = (parse_qs(body.decode()).get("code") or [""])[0]
            return 200, f"access_token=token-{code.removeprefix('code-')}&token_type=bearer"
        person = self.people.get(token or "")
        if person is None:
            return 401, {"message": "Bad credentials"}
        if path == "/user":
            return 200, {"login": person.login, "id": person.user_id, "avatar_url": "", "email": None}
        if path == "/user/emails":
            return 200, [
                {"email": email, "verified": verified, "primary": index == 0, "visibility": None}
                for index, (email, verified) in enumerate(person.emails)
            ]
        if path.startswith("/user/memberships/orgs/"):
            org = path.rsplit("/", 1)[1].lower()
            state = {name.lower(): value for name, value in person.orgs.items()}.get(org)
            return (200, {"state": state, "role": "member"}) if state else (404, {"message": "Not Found"})
        return 404, {"message": "Not Found"}


def _handler_for(github: FakeGitHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _serve(self, method: str) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            token = (self.headers.get("Authorization") or "").split(" ", 1)[-1] or None
            status, payload = github.answer(method, urlsplit(self.path).path, token, body)
            data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
            self.send_response(status)
            kind = "application/x-www-form-urlencoded" if isinstance(payload, str) else "application/json"
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            self._serve("GET")

        def do_POST(self) -> None:
            self._serve("POST")

        def log_message(self, *args: Any) -> None:
            pass

    return Handler


@dataclass
class ProviderSignIn:
    """What the browser got back from the app's OAuth callback."""

    cookie: str | None  # the sign-in cookie (Cookie header value), None when refused
    location: str  # where the app sent the browser
    authorize_url: str  # where the app sent the browser first (the provider's consent page)


async def sign_in_with_github(base_url: str, code: str) -> ProviderSignIn:
    """The browser's side of GitHub sign-in: start at /auth/oauth/github, come back with `code`."""
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
        start = await http.get("/auth/oauth/github")
        assert start.status_code in (302, 307), (start.status_code, start.text)
        authorize_url = start.headers["location"]
        state = parse_qs(urlsplit(authorize_url).query)["state"][0]
        back = await http.get("/auth/oauth/github/callback", params={"code": code, "state": state})
        token = back.cookies.get(COOKIE_NAME)
        return ProviderSignIn(
            f"{COOKIE_NAME}={token}" if token else None, back.headers.get("location", ""), authorize_url
        )
