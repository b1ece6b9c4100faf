"""Shared fixtures: models built once, one engine and one server per model.

Tests are marked by tier from their fixtures (tests/tiers.py): `-m "not engine"` runs the
pure-logic tests in seconds, `-m "not long"` is the per-commit tier. The session leaves the temp
folder as it found it: engines and servers clean up, and its summary says how many engines started.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections import OrderedDict
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from harness.postgres import PostgresCluster
from harness.server import ROOT, STARTED, AppServer
from harness.slapd import Slapd
from harness.tiny_model import build_tiny_model
from services.config import Settings
from services.config.engine import default_cache_dir
from services.engine.backends.local import ensure_default_model
from tests.tiers import EngineCensus, mark_tiers, register_hypothesis_profiles

ARTIFACTS = ROOT / "artifacts"
TINY_MAX_MODEL_LEN = 4096
TINY_MAX_UPLOAD_BYTES = 2_000_000
TINY_OPS_TOKEN = "tiny-ops-token"  # the shared server's ops routes are guarded, as in production


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    return ensure_default_model(Settings.from_env({}))


@pytest.fixture(scope="session")
def tiny_model_dir(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(default_model_dir, tmp_path_factory.mktemp("models") / "tiny-llama")


def tiny_settings(model_dir: Path, **changes) -> Settings:
    """Settings for the tiny model: small budgets so tests run in seconds."""
    return Settings.from_env({}).replace(
        model=str(model_dir), max_model_len=TINY_MAX_MODEL_LEN, max_num_batched_tokens=4096, **changes
    )


def server_env(**values: object) -> dict[str, str]:
    return {key: str(value) for key, value in values.items()}


class ServerPool:
    """Running app servers by their settings: the tests of one configuration share one server.

    A configuration is the env plus the names of the steps run before and after its start (a data
    folder made loose, accounts added): the same configuration gets the same running server for
    the whole session. At most `keep` servers stay alive, the least recently used stopped first
    (only one engine should run at a time: vLLM binds each CPU worker to the same cores, so
    engines running together slow each other down); `order_by_server` runs each configuration's
    tests together, so each starts once.
    """

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self.alive: OrderedDict[tuple, AppServer] = OrderedDict()
        self.leftovers: list[str] = []  # engine processes that outlived a stopped server
        self.users: dict[int, list[str]] = {}  # by id(server): who asked for it, in order

    def get(
        self,
        env: dict[str, str],
        log_name: str,
        before_start: Callable[[AppServer], None] | None = None,
        after_start: Callable[[AppServer], None] | None = None,
        user: str = "",
        start_timeout: float = 300,
    ) -> AppServer:
        """The running server of this configuration, started now if none is; `user` (a module's
        name, say) is remembered in `users[id(server)]`; `start_timeout`: seconds to become ready."""
        server = self._get(env, log_name, before_start, after_start, start_timeout)
        self.users.setdefault(id(server), []).append(user)
        return server

    def _get(
        self,
        env: dict[str, str],
        log_name: str,
        before_start: Callable[[AppServer], None] | None,
        after_start: Callable[[AppServer], None] | None,
        start_timeout: float = 300,
    ) -> AppServer:
        steps = tuple(step.__qualname__ if step else "" for step in (before_start, after_start))
        key = (tuple(sorted(env.items())), steps)
        if key in self.alive:
            self.alive.move_to_end(key)
            return self.alive[key]
        while len(self.alive) >= self.keep:
            self._stop(self.alive.popitem(last=False)[1])
        server = AppServer(env, ARTIFACTS / "logs" / f"{log_name}.log")
        if before_start:
            before_start(server)
        server.start(start_timeout)
        self.alive[key] = server
        try:
            if after_start:
                after_start(server)
        except BaseException:
            self._stop(self.alive.pop(key))
            raise
        return server

    def stop(self, server: AppServer, sig: int) -> list:
        """Stop a pooled server now with `sig` (a test of how the app stops, on a server its group's
        other tests are done with); return the engine processes it left. A later user gets a new one."""
        for key, alive in list(self.alive.items()):
            if alive is server:
                del self.alive[key]
        return server.stop(sig)

    def _stop(self, server: AppServer) -> None:
        leftovers = server.stop()
        self.leftovers += [f"{server.log_path.name}: {process}" for process in leftovers]

    def close(self) -> None:
        while self.alive:
            self._stop(self.alive.popitem(last=False)[1])


# Fixtures that take their server from the pool, by name: the server group (`order_by_server`
# runs each group's modules together). Fixtures of one group hand out the same server.
POOLED_SERVERS: dict[str, str] = {}


def pooled(function: Callable | None = None, *, scope: str = "module", group: str = "") -> Callable:
    """A fixture that takes its server from the pool (its name and group go in POOLED_SERVERS)."""

    def register(function: Callable) -> Callable:
        POOLED_SERVERS[function.__name__] = group or function.__name__
        return pytest.fixture(scope=scope)(function)  # type: ignore[call-overload]

    return register(function) if function else register


@pytest.fixture(scope="session")
def server_pool() -> Iterator[ServerPool]:
    pool = ServerPool(keep=3)
    yield pool
    pool.close()
    assert not pool.leftovers, f"engine processes outlived their server: {pool.leftovers}"


def tiny_server_env(model_dir: Path) -> dict[str, str]:
    return server_env(
        MODEL=model_dir, MAX_MODEL_LEN=TINY_MAX_MODEL_LEN, MAX_NUM_BATCHED_TOKENS=4096,
        MAX_NEW_TOKENS=48, MAX_SESSIONS=100, SUMMARY_MAX_TOKENS=24, SUMMARY_CHUNK_TOKENS=1024,
        MAX_UPLOAD_BYTES=TINY_MAX_UPLOAD_BYTES, OPS_TOKEN=TINY_OPS_TOKEN,
    )  # fmt: skip


@pooled
def tiny_server(server_pool: ServerPool, tiny_model_dir: Path) -> AppServer:
    """A real `chainlit run` serving the tiny model (shared by the server tests)."""
    return server_pool.get(tiny_server_env(tiny_model_dir), "tiny-server")


@pooled
def default_server(
    server_pool: ServerPool, default_model_dir: Path, request: pytest.FixtureRequest
) -> AppServer:
    """A real `chainlit run` on the default model, as `scripts/run.sh` starts it."""
    return server_pool.get({"MODEL": ""}, "default-server", user=request.module.__name__)


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresCluster]:
    """A throwaway PostgreSQL cluster (Debian's postgresql) on a free loopback port, for the session."""
    cluster = PostgresCluster().start()
    yield cluster
    cluster.remove()


LDAP_READER_PASSWORD = "reader-secret-4f9a"  # the directory's service account (search, re-checks)
LDAP_PEOPLE = {"alice": "alice-ldap-secret-1", "bob": "bob-ldap-secret-2", "root": "root-ldap-secret-3"}
LDAP_ADMINS = ["root"]  # members of cn=admins


@pytest.fixture(scope="session")
def slapd() -> Iterator[Slapd]:
    """A throwaway OpenLDAP directory (Debian's slapd) on a free loopback port, for the session:
    LDAP_PEOPLE under ou=people, LDAP_ADMINS in cn=admins (harness/slapd.py)."""
    directory = Slapd(LDAP_READER_PASSWORD).start()
    try:
        directory.load(LDAP_PEOPLE, LDAP_ADMINS)
        yield directory
    finally:
        directory.remove()


# Each test session gets a temp folder of its own (TMPDIR, inherited by every server and
# engine it starts), so that concurrent sessions do not see each other's files; the
# session checks that it leaves that folder as it found it, then removes it.
SESSION_TEMP = Path(tempfile.mkdtemp(prefix="chat-tests-"))
HYPOTHESIS_HOME = "hypothesis"


def pytest_configure(config: pytest.Config) -> None:
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ["TMPDIR"] = tempfile.tempdir = str(SESSION_TEMP)
    # torch.compile's cache where the app keeps it (services/engine/backends/local): kept between runs.
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(Path(default_cache_dir()) / "torchinductor"))
    # Hypothesis (the fuzz tests) keeps caches in ./.hypothesis unless told otherwise: they go with
    # the session's folder (its example database is off: tests/system/security/fuzzing.py).
    os.environ.setdefault("HYPOTHESIS_STORAGE_DIRECTORY", str(SESSION_TEMP / HYPOTHESIS_HOME))
    register_hypothesis_profiles(ARTIFACTS / "hypothesis-examples")
    config.stash[ENGINES] = EngineCensus().start()


def pytest_unconfigure(config: pytest.Config) -> None:
    if census := config.stash.get(ENGINES, None):
        census.stop()
    shutil.rmtree(SESSION_TEMP, ignore_errors=True)


ENGINES = pytest.StashKey[EngineCensus]()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test's tiers (tests/tiers.py); order the modules so that each pooled server's
    tests run together."""
    mark_tiers(items)
    items[:] = order_by_server(items)


def order_by_server(items: list[pytest.Item]) -> list[pytest.Item]:
    """Whole modules in a new order, each module's tests in theirs: unit tests first (they fail
    fastest), then the modules that use no pooled server (engines and servers of their own), then
    those of each server group together, so that the pool starts each server once and no pooled
    server idles beside a test that measures.

    A module belongs to the group most of its tests use. Groups run in the order of the last
    module that uses each (then of the first): a group whose modules are spread over packages that
    other groups use too (the password server: accounts/ and security/) runs next to the groups of
    the package it ends in, so a module that needs two of them finds both alive. A module with
    FIRST_ON_ITS_SERVER = True comes first among its group's modules, one with LAST_ON_ITS_SERVER =
    True (it stops the server) last."""
    modules: dict[str, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::")[0], []).append(item)

    def groups_of(tests: list[pytest.Item]) -> list[str]:
        return [
            POOLED_SERVERS[name]
            for item in tests
            for name in getattr(item, "fixturenames", ())
            if name in POOLED_SERVERS
        ]

    seen: dict[str, list[int]] = {}  # group: indexes of the modules that use it
    group_of: dict[str, str | None] = {}
    for index, (path, tests) in enumerate(modules.items()):
        names = groups_of(tests)
        group_of[path] = max(sorted(set(names)), key=names.count) if names else None
        for group in set(names):
            seen.setdefault(group, []).append(index)
    rank = {group: (max(indexes), min(indexes)) for group, indexes in seen.items()}

    keys = {}
    for index, (path, tests) in enumerate(modules.items()):
        group = group_of[path]
        if group is None:
            keys[path] = (0 if path.startswith("tests/unit/") else 1, (0, 0), False, index)
        else:
            module = getattr(tests[0], "module", None)
            place = 0 if getattr(module, "FIRST_ON_ITS_SERVER", False) else 1
            place = 2 if getattr(module, "LAST_ON_ITS_SERVER", False) else place
            keys[path] = (2, rank[group], place, index)
    return [item for path in sorted(modules, key=keys.__getitem__) for item in modules[path]]


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    if STARTED:
        terminalreporter.write_line(f"servers started: {len(STARTED)} ({', '.join(STARTED)})")
    if census := config.stash.get(ENGINES, None):
        terminalreporter.write_line(f"vLLM engines started: {census.stop()}")


# pytest's own tmp_path root, and torch's compile cache: torch writes part of it under
# tempfile.gettempdir() whatever TORCHINDUCTOR_CACHE_DIR says (torch/_inductor/cache.py,
# codecache.py call default_cache_dir() directly). Both go with the session's folder.
NOT_OURS = ("pytest-of-", "torchinductor_", HYPOTHESIS_HOME)


@pytest.fixture(scope="session", autouse=True)
def temp_folder_left_as_found() -> Iterator[None]:
    """Fail the session if it leaves files in its temp folder (vLLM sockets, RPC folders, uploads)."""
    yield
    left = sorted(name for name in os.listdir(SESSION_TEMP) if not name.startswith(NOT_OURS))
    assert not left, f"the tests left these in the temp folder: {left}"
