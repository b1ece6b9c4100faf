"""The whole scale-out topology on one machine, for trying it and for its test:

    HAProxy (sticky) -> 2 app replicas (`chainlit run`) -> vLLM's router -> 2 `vllm serve`
                              \\-> one PostgreSQL (conversations, accounts, shared limits)

    python -m deploy.topology [--model PATH] [--port 8000]

starts everything on loopback, prints the address and the administrator's password, and stops
everything on Ctrl-C. The replicas run in password sign-in mode with one cookie secret, so a page
moved to the other replica stays signed in; `TRUSTED_PROXY_ADDRESSES` makes them read the client's
address from the balancer. Parts that need nothing of each other start together: PostgreSQL and the
vLLM servers, then the router, then both replicas, then HAProxy; while a stage starts it says every
STATUS_EVERY_SECONDS what it still waits for. The same parts on several machines:
deploy/compose.yaml, deploy/helm/.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import secrets
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from harness.balancer import Balancer
from harness.postgres import PostgresCluster
from harness.router import VllmRouter
from harness.server import ROOT, AppServer, VllmServer
from services.config import Settings
from services.engine.backends.local.model_prep import ensure_default_model

REPLICAS = 2
ENGINE_SERVERS = 2
START_TIMEOUT_SECONDS = 600.0  # a vLLM server or a replica that is not ready by then stops the start
STATUS_EVERY_SECONDS = 10.0
Step = tuple[str, Callable[[], object]]  # a part's name, and what starts it (returns once it is ready)


def run_together(
    steps: Sequence[Step], say: Callable[[str], None], every: float = STATUS_EVERY_SECONDS
) -> None:
    """Start every step at once, each in a thread, and wait for all of them, saying every `every`
    seconds which are still starting; then raise the first failure (in the steps' order)."""
    started = time.monotonic()
    pool = ThreadPoolExecutor(max_workers=len(steps), thread_name_prefix="topology-start")
    try:
        futures: dict[Future, str] = {pool.submit(start): name for name, start in steps}
        pending = set(futures)
        while pending:
            _, pending = wait(pending, timeout=every)
            if pending:
                waiting = ", ".join(name for future, name in futures.items() if future in pending)
                say(f"waiting for {waiting} ({time.monotonic() - started:.0f} s)")
    finally:
        pool.shutdown(wait=True)
    for future in futures:
        if (error := future.exception()) is not None:
            raise error


def without_password(url: str) -> str:
    """`url` with its password (if any) left out, for printing."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username}@{host}" if parts.username else host
    return urlunsplit(parts._replace(netloc=netloc + (f":{parts.port}" if parts.port else "")))


def banner(
    balancer: str, replicas: Sequence[str], router: str, engines: Sequence[str], database: str
) -> list[str]:
    """The lines naming every address of a started topology, people's first."""
    return [
        f"open {balancer} (HAProxy, sticky across the replicas)",
        *(f"replica {n}: {url} (probes: /readyz, /livez, /healthz)" for n, url in enumerate(replicas, 1)),
        f"vLLM's router: {router}",
        *(f"vLLM server {n}: {url}" for n, url in enumerate(engines, 1)),
        f"database: {without_password(database)}",
    ]


@dataclass
class Topology:
    """The parts, started in order by `start` and stopped in reverse by `stop`."""

    model_dir: Path
    logs: Path
    max_model_len: int = 8192
    port: int | None = None
    app_env: dict[str, str] = field(default_factory=dict)  # more settings for both replicas
    engine_servers: int = ENGINE_SERVERS
    app_replicas: int = REPLICAS
    engine_args: tuple[str, ...] = ()  # more `vllm serve` options for each engine server
    engine_env: dict[str, str] = field(default_factory=dict)  # more environment for each engine server
    start_timeout: float = START_TIMEOUT_SECONDS  # for each vLLM server and each replica
    admin_password: str = field(default_factory=lambda: secrets.token_urlsafe(12))
    ops_token: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    postgres: PostgresCluster | None = None
    engines: list[VllmServer] = field(default_factory=list)
    router: VllmRouter | None = None
    replicas: list[AppServer] = field(default_factory=list)
    balancer: Balancer | None = None
    database_url: str = ""

    @property
    def url(self) -> str:
        assert self.balancer is not None, "not started"
        return self.balancer.url

    def replica_env(self, database_url: str, router_url: str) -> dict[str, str]:
        return {
            "AUTH_MODE": "password",
            "ADMIN_USERNAME": "admin",
            "ADMIN_PASSWORD": self.admin_password,
            "CHAINLIT_AUTH_SECRET": self.cookie_secret,
            "OPS_TOKEN": self.ops_token,
            "DATABASE_URL": database_url,
            "ENGINE_URLS": router_url,
            "ENGINE_ROUTER": "true",
            "MODEL": str(self.model_dir),
            "TRUSTED_PROXY_ADDRESSES": "127.0.0.1",
            **self.app_env,
        }

    def start(self, say: Callable[[str], None] = lambda line: None) -> Topology:
        """Start every part, each stage once the one before is ready (module docstring); `say` hears
        what is awaited while a stage starts. On a failure, stop what started."""
        if self.app_replicas not in (1, 2):
            raise ValueError("deploy/haproxy.cfg balances two replicas (or one, twice)")
        self.cookie_secret = secrets.token_urlsafe(48)
        self.engines = [
            VllmServer(self.model_dir, self.logs / f"vllm-{i}.log", self.max_model_len, *self.engine_args)
            for i in range(1, self.engine_servers + 1)
        ]
        for engine in self.engines:
            engine.env.update(self.engine_env)
        try:
            for stage in self.stages():
                say(f"starting {', '.join(name for name, _ in stage)}")
                run_together(stage, say)
        except BaseException:
            self.stop()
            raise
        return self

    def stages(self) -> Iterator[list[Step]]:
        """The steps of `start`, stage by stage, each built once the stages before it are up: what
        needs nothing else first, the balancer last."""
        timeout = self.start_timeout
        engines = [
            (f"vLLM server {n}", functools.partial(e.start, timeout)) for n, e in enumerate(self.engines, 1)
        ]
        yield [("PostgreSQL", self._start_database), *engines]
        yield [("vLLM's router", self._start_router)]
        assert self.router is not None
        env = self.replica_env(self.database_url, self.router.url)
        numbers = range(1, self.app_replicas + 1)
        self.replicas = [AppServer(dict(env), self.logs / f"app-{n}.log") for n in numbers]
        yield [(f"replica {n}", functools.partial(r.start, timeout)) for n, r in enumerate(self.replicas, 1)]
        yield [("HAProxy", self._start_balancer)]

    def _start_database(self) -> None:
        self.postgres = PostgresCluster()
        self.database_url = self.postgres.start().create_database("chat")

    def _start_router(self) -> None:
        self.router = VllmRouter([e.url for e in self.engines], self.logs / "router.log").start()

    def _start_balancer(self) -> None:
        addresses = [f"127.0.0.1:{r.port}" for r in self.replicas]
        addresses *= 2 // len(addresses)  # haproxy.cfg names two: one replica (benchmarks) is both
        self.balancer = Balancer(addresses, self.logs / "haproxy.log", self.port).start()

    def banner(self) -> list[str]:
        """Every address of the started topology (the database's without a password)."""
        assert self.balancer is not None and self.router is not None, "not started"
        replicas = [r.base_url for r in self.replicas]
        engines = [e.url for e in self.engines]
        return banner(self.balancer.url, replicas, self.router.url, engines, self.database_url)

    def stop(self) -> None:
        """Stop every part still running, the balancer first; PostgreSQL's files go too."""
        for part in (self.balancer, *self.replicas, self.router, *self.engines):
            if part is not None:
                with contextlib.suppress(Exception):
                    part.stop()
        if self.postgres is not None:
            self.postgres.remove()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, help="a model folder vLLM loads (default: the default model)")
    parser.add_argument("--max-model-len", type=int, default=Settings.from_env({}).max_model_len)
    parser.add_argument("--port", type=int, default=8000, help="the balancer's port on 127.0.0.1")
    parser.add_argument("--logs", type=Path, default=ROOT / "artifacts" / "topology")
    parser.add_argument(
        "--start-timeout",
        type=float,
        default=START_TIMEOUT_SECONDS,
        help="seconds each vLLM server and each replica may take to become ready",
    )
    args = parser.parse_args()
    model = args.model or ensure_default_model(Settings.from_env({}))
    topology = Topology(model, args.logs, args.max_model_len, args.port, start_timeout=args.start_timeout)

    def say(line: str) -> None:
        print(f"[topology] {line}", flush=True)

    say("PostgreSQL and 2 vLLM servers together, then vLLM's router, 2 app replicas, HAProxy")
    topology.start(say)
    for line in topology.banner():
        say(line)
    say(f"sign in as admin / {topology.admin_password}")
    say(f"operators' routes: Authorization: Bearer {topology.ops_token}")
    say(f"logs in {args.logs}; Ctrl-C stops everything")
    stopped = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stopped.set())
    try:
        stopped.wait()
    finally:
        topology.stop()


if __name__ == "__main__":
    main()
