"""Real `chainlit run` servers (tiny model, SQLite) shared by the attack suite, one per distinct
settings (from the session's server pool): every attack runs against the real routes and the real
socket.

- `target`: password sign-in with people ALICE and BOB and the administrator ADMIN, GitHub sign-in
  too (against `fake_github`, with an allowlist), uvicorn trusting every X-Forwarded-For
  (FORWARDED_ALLOW_IPS=*, as containers are often run);
- `local_target`: nothing configured, on loopback: the one local user (the default install);
- `proxied_target`: header sign-in behind an auth proxy at PROXY_ADDRESS, uvicorn trusting every
  X-Forwarded-For.
"""

from __future__ import annotations

import asyncio
import secrets
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from harness.chat_client import ChatClient, sign_in
from harness.fake_github import FakeGitHub
from harness.server import ROOT, AppServer
from tests.conftest import TINY_MAX_MODEL_LEN, ServerPool, pooled, server_env
from tests.system.accounts.test_people import ADMIN, ALICE, BOB, accounts, stored_thread
from tests.system.security.fuzzing import ServerLog, Surroundings, Victims, make_canary

__all__ = ["ADMIN", "ALICE", "BOB", "accounts"]

# A change made by the accounts command (another process) reaches the server's checks this late at
# most; the default is 30 s, shortened here so the attacks on ended sign-ins run quickly.
SIGN_IN_CHECK_SECONDS = 1

GITHUB_ORG = "acme"  # members of this GitHub organisation may sign in
ALLOWED_DOMAIN = "example.com"  # and people with a verified e-mail address here
ALLOWED_GITHUB_USER = "github:carol-gh"  # and this one GitHub user
PROXY_ADDRESS = "127.0.0.2"  # the auth proxy of `proxied_target` (a loopback address of its own)
PROXY_USER_HEADER = "X-Auth-User"


def tiny_env(model_dir: Path, **values: object) -> dict[str, str]:
    return server_env(
        MODEL=model_dir, MAX_MODEL_LEN=TINY_MAX_MODEL_LEN, MAX_NUM_BATCHED_TOKENS=4096, MAX_NEW_TOKENS=8,
        **values,
    )  # fmt: skip


OPS_TOKEN = "security-ops-token"  # the operators' routes are guarded, as they must be in production


def loosen(data_dir: Path) -> None:
    """DATA_DIR and its files readable by everyone, as an older version or a careless copy left them."""
    data_dir.chmod(0o755)
    for name in ("chat.db", "chat.db-wal", "chat.db-shm"):
        (data_dir / name).touch(0o644)
    (data_dir / "auth-secret").write_text(secrets.token_urlsafe(48))
    for path in data_dir.iterdir():
        path.chmod(0o644)


@pytest.fixture(scope="session")
def fake_github() -> Iterator[FakeGitHub]:
    """For the session: its address is part of `target`'s settings, which the pool keys servers by."""
    github = FakeGitHub().start()
    yield github
    github.stop()


def add_alice_and_bob(server: AppServer) -> None:
    for name, password in (ALICE, BOB):
        accounts(Path(server.env["DATA_DIR"]), "add", name, stdin=password + "\n")


@pooled(scope="package")
def target(
    server_pool: ServerPool,
    tiny_model_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
    fake_github: FakeGitHub,
) -> AppServer:
    def loosened_data_dir(server: AppServer) -> None:
        data_dir = tmp_path_factory.mktemp("attacked-data")
        loosen(data_dir)
        server.env["DATA_DIR"] = str(data_dir)

    env = tiny_env(
        tiny_model_dir, AUTH_MODE="password", ADMIN_USERNAME=ADMIN[0],
        ADMIN_PASSWORD=ADMIN[1], FORWARDED_ALLOW_IPS="*", SIGN_IN_CHECK_SECONDS=SIGN_IN_CHECK_SECONDS,
        OAUTH_ALLOWED_ORGS=GITHUB_ORG, OAUTH_ALLOWED_DOMAINS=ALLOWED_DOMAIN,
        OAUTH_ALLOWED_USERS=ALLOWED_GITHUB_USER, OPS_TOKEN=OPS_TOKEN, **fake_github.env(),
    )  # fmt: skip
    return server_pool.get(env, "security-server", loosened_data_dir, add_alice_and_bob)


@pooled(scope="package")
def local_target(server_pool: ServerPool, tiny_model_dir: Path) -> AppServer:
    """The default install: no sign-in configured, bound to 127.0.0.1 (the local user)."""
    return server_pool.get(tiny_env(tiny_model_dir), "security-local-server")


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
    await asyncio.sleep(1)  # Chainlit stores the session's metadata after the disconnect
    step_ids = [s["id"] for s in stored["steps"]]
    return BobsConversation(server.base_url, bob.cookie or "", bob.thread_id, step_ids, secret)


@pytest.fixture(scope="package")
def bob(target: AppServer) -> BobsConversation:
    conversation = asyncio.run(_bobs_conversation(target))
    conversation.before = conversation.snapshot()
    return conversation


@pytest.fixture(scope="package")
def alice_cookie(target: AppServer) -> str:
    cookie = asyncio.run(sign_in(target.base_url, *ALICE))
    assert cookie
    return cookie


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
        held = self.chainlit_sessions()
        for _ in range(50):  # a closed socket's session is dropped as its disconnect is handled
            if held <= mark.chainlit_sessions:
                return []
            time.sleep(0.1)
            held = self.chainlit_sessions()
        return [f"Chainlit holds {held} sessions, before {mark}"]


@pytest.fixture(scope="package")
def intact(
    target: AppServer, server_log: ServerLog, surroundings: Surroundings, bob: BobsConversation
) -> Intact:
    return Intact(target, server_log, surroundings, bob)
