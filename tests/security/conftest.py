"""One real `chainlit run` (tiny model, SQLite, password sign-in) with two people on it, shared by
the attack suite: every attack runs as a signed-in person, or as nobody, against the real routes
and the real socket."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from harness.chat_client import ChatClient, sign_in
from harness.server import ROOT, AppServer
from tests.conftest import ARTIFACTS, TINY_MAX_MODEL_LEN, server_env
from tests.security.fuzzing import ServerLog, Surroundings, Victims, make_canary
from tests.test_people import ADMIN, ALICE, BOB, accounts, stored_thread

__all__ = ["ALICE", "BOB"]


@pytest.fixture(scope="package")
def target(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AppServer]:
    data_dir = tmp_path_factory.mktemp("attacked-data")
    env = server_env(
        MODEL=tiny_model_dir, MAX_MODEL_LEN=TINY_MAX_MODEL_LEN, MAX_NUM_BATCHED_TOKENS=4096,
        MAX_NEW_TOKENS=8, AUTH_MODE="password", ADMIN_USERNAME=ADMIN[0], ADMIN_PASSWORD=ADMIN[1],
        DATA_DIR=data_dir,
    )  # fmt: skip
    server = AppServer(env, ARTIFACTS / "logs" / "security-server.log").start()
    for name, password in (ALICE, BOB):
        accounts(data_dir, "add", name, stdin=password + "\n")
    yield server
    assert not server.stop(), "engine processes outlived the server"


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
