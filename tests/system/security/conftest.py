"""Real `chainlit run` servers (tiny model, SQLite) shared by the attack suite, one per distinct
settings (from the session's server pool): every attack runs against the real routes and the real
socket.

- `target`: the password server the people tests share (tests/system/conftest.py): password
  sign-in with people ALICE and BOB and the administrator ADMIN, GitHub sign-in too (against
  `fake_github`, with an allowlist), uvicorn trusting every X-Forwarded-For
  (FORWARDED_ALLOW_IPS=*, as containers are often run);
- `local_target`: nothing configured, on loopback: the one local user (the default install), the
  tiny server of the chat tests;
- `proxied_target`: header sign-in behind an auth proxy at PROXY_ADDRESS, uvicorn trusting every
  X-Forwarded-For.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from harness.chat_client import ChatClient, sign_in
from harness.fake_github import FakeGitHub, GitHubPerson, sign_in_with_github
from harness.server import ROOT, AppServer
from harness.waiting import until_sync
from services.history.resume import chat_settings_of
from tests.conftest import ServerPool, pooled, tiny_server_env
from tests.system.conftest import (
    ADMIN,
    ALICE,
    ALLOWED_DOMAIN,
    ALLOWED_GITHUB_USER,
    BOB,
    GITHUB_ORG,
    OPS_TOKEN,
    SIGN_IN_CHECK_SECONDS,
    accounts,
    shared_password_server,
    tiny_env,
)
from tests.system.helpers import stored_thread
from tests.system.security.fuzzing import ServerLog, Surroundings, Victims, make_canary

__all__ = [
    "ADMIN", "ALICE", "ALLOWED_DOMAIN", "ALLOWED_GITHUB_USER", "BOB", "GITHUB_ORG", "OPS_TOKEN",
    "SIGN_IN_CHECK_SECONDS", "accounts",
]  # fmt: skip

PROXY_ADDRESS = "127.0.0.2"  # the auth proxy of `proxied_target` (a loopback address of its own)
PROXY_USER_HEADER = "X-Auth-User"


@pooled(scope="package", group="password")
def target(
    server_pool: ServerPool,
    tiny_model_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
    fake_github: FakeGitHub,
) -> AppServer:
    """The password server, shared with the people tests (tests/system/conftest.py)."""
    return shared_password_server(server_pool, tiny_model_dir, tmp_path_factory, fake_github)


@pooled(scope="package", group="tiny_server")
def local_target(server_pool: ServerPool, tiny_model_dir: Path) -> AppServer:
    """The default install: no sign-in configured, bound to 127.0.0.1 (the local user); the tiny
    server the chat tests use."""
    return server_pool.get(tiny_server_env(tiny_model_dir), "tiny-server")


@pooled(scope="package")
def proxied_target(server_pool: ServerPool, tiny_model_dir: Path) -> AppServer:
    """Header sign-in: only PROXY_ADDRESS may name the user; uvicorn trusts every X-Forwarded-For."""
    env = tiny_env(
        tiny_model_dir, AUTH_MODE="header", AUTH_HEADER=PROXY_USER_HEADER, AUTH_PROXY_ADDRESSES=PROXY_ADDRESS,
        FORWARDED_ALLOW_IPS="*",
    )  # fmt: skip
    return server_pool.get(env, "security-proxied-server")


# --- what the fuzz tests attack, and what they check stays intact -------------------------------


@dataclass
class BobsConversation:
    """Bob's stored conversation, which no attack by Alice or by nobody may read or change."""

    base_url: str
    cookie: str
    thread_id: str
    step_ids: list[str]
    secret: str  # a word only Bob's message holds: it must never appear in anyone else's response
    before: dict = field(default_factory=dict)

    def snapshot(self) -> dict:
        with httpx.Client(base_url=self.base_url, headers={"Cookie": self.cookie}, timeout=30) as http:
            thread = http.get(f"/project/thread/{self.thread_id}").json()
            listed = http.post("/project/threads", json={"pagination": {"first": 20}, "filter": {}}).json()
        steps = sorted((s["id"], s["type"], s.get("output"), s.get("threadId")) for s in thread["steps"])
        return {"name": thread.get("name"), "steps": steps, "listed": sorted(t["id"] for t in listed["data"])}

    def settings_stored(self) -> bool:
        """Chainlit stores the session's metadata (its chat settings) as it handles the disconnect:
        from then on, nothing of Bob's changes unless an attack changes it."""
        with httpx.Client(base_url=self.base_url, headers={"Cookie": self.cookie}, timeout=30) as http:
            return bool(chat_settings_of(http.get(f"/project/thread/{self.thread_id}").json()))

    def changes(self) -> list[str]:
        now = self.snapshot()
        return [
            f"Bob's {key}: {self.before[key]} -> {now[key]}" for key in now if now[key] != self.before[key]
        ]


async def _bobs_conversation(server: AppServer) -> BobsConversation:
    secret = f"bobsecret{uuid.uuid4().hex[:12]}"
    bob = ChatClient(server.base_url, *BOB)
    await bob.connect()
    assert (await bob.ask(f"My secret word is {secret}.")).final is not None
    assert bob.thread_id
    stored = await stored_thread(bob, bob.thread_id, steps=2)
    await bob.close()
    step_ids = [s["id"] for s in stored["steps"]]
    return BobsConversation(server.base_url, bob.cookie or "", bob.thread_id, step_ids, secret)


@pytest.fixture(scope="package")
def bob(target: AppServer) -> BobsConversation:
    conversation = asyncio.run(_bobs_conversation(target))
    until_sync(conversation.settings_stored, "Bob's chat settings stored at his disconnect")
    conversation.before = conversation.snapshot()
    return conversation


@pytest.fixture(scope="package")
def alice_cookie(target: AppServer) -> str:
    cookie = asyncio.run(sign_in(target.base_url, *ALICE))
    assert cookie
    return cookie


@pytest.fixture(scope="package")
def new_person(target: AppServer, fake_github: FakeGitHub) -> Callable[[], str]:
    """Signs someone new in (a member of the allowed GitHub organisation) and returns their cookie:
    fuzz tests send each example as a new person, so per-person limits (messages per minute) never
    run out, whatever the profile's number of examples, and never reach the other tests' people."""

    def sign_in_someone_new() -> str:
        person = GitHubPerson(f"fuzz-{uuid.uuid4().hex[:12]}", orgs={GITHUB_ORG: "active"})
        signed = asyncio.run(sign_in_with_github(target.base_url, fake_github.register(person)))
        assert signed.cookie, signed.location
        return signed.cookie

    return sign_in_someone_new


@pytest.fixture(scope="package")
def surroundings(target: AppServer, tmp_path_factory: pytest.TempPathFactory) -> Surroundings:
    app_root = Path(target.env["CHAINLIT_APP_ROOT"])
    around = Surroundings(
        canary=make_canary(tmp_path_factory.mktemp("canary")), data_dir=Path(target.env["DATA_DIR"]),
        work_dir=ROOT, files_dir=app_root / ".files",
    )  # fmt: skip
    around.remember()
    return around


@pytest.fixture(scope="package")
def victims(bob: BobsConversation, surroundings: Surroundings, alice_cookie: str) -> Victims:
    return Victims(surroundings.canary, bob.thread_id, bob.step_ids[0], alice_cookie)


@pytest.fixture(scope="package")
def server_log(target: AppServer) -> ServerLog:
    return ServerLog(target.log_path)


@dataclass(frozen=True)
class Mark:
    """Where an attack started: the log's length and how many sessions Chainlit held (not counting
    those kept for a page that may reconnect)."""

    log: int
    chainlit_sessions: int


@dataclass
class Intact:
    """Everything an attack must leave true, checked at once."""

    target: AppServer
    log: ServerLog
    surroundings: Surroundings
    bob: BobsConversation

    def mark(self) -> Mark:
        return Mark(self.log.mark(), self.chainlit_sessions())

    def chainlit_sessions(self) -> int:
        """Chainlit's sessions, less those kept for a page that may reconnect (session_timeout)."""
        status = self.target.status()
        return status["chainlit_ws_sessions"] - status["sessions_awaiting_reconnect"]

    def problems(self, mark: Mark, sessions: bool = True) -> list[str]:
        """What went wrong since `mark`: the server down, an error in its log, a file outside its
        folders, Bob's conversation changed, and (with `sessions`) Chainlit holding sessions that
        outlived their socket."""
        status, detail = self.target.healthz()
        down = [] if status == 200 else [f"/healthz answered {status}: {detail}"]
        errors = [f"server log:\n{text}" for text in self.log.problems_since(mark.log)]
        kept = self.kept_sessions(mark) if sessions else []
        return down + errors + self.surroundings.changes() + self.bob.changes() + kept

    def kept_sessions(self, mark: Mark) -> list[str]:
        # A closed socket's session is dropped as its disconnect is handled: within seconds, though
        # on 2 busy cores it has taken more than 5 s. A session kept for a page that may reconnect
        # would stay session_timeout (120 s), so 20 s still tells the two apart.
        deadline = time.monotonic() + 20
        held = self.chainlit_sessions()
        while held > mark.chainlit_sessions and time.monotonic() < deadline:
            time.sleep(0.1)
            held = self.chainlit_sessions()
        return [] if held <= mark.chainlit_sessions else [f"Chainlit holds {held} sessions, before {mark}"]


@pytest.fixture(scope="package")
def intact(
    target: AppServer, server_log: ServerLog, surroundings: Surroundings, bob: BobsConversation
) -> Intact:
    return Intact(target, server_log, surroundings, bob)
