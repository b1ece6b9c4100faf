"""The whole scale-out topology on one machine, for trying it and for its test:

    HAProxy (sticky) -> 2 app replicas (`chainlit run`) -> vLLM's router -> 2 `vllm serve`
                              \\-> one PostgreSQL (conversations, accounts, shared limits)

    python -m deploy.topology [--model PATH] [--port 8000]

starts everything on loopback, prints the address and the administrator's password, and stops
everything on Ctrl-C. The replicas run in password sign-in mode with one cookie secret, so a page
moved to the other replica stays signed in; `TRUSTED_PROXY_ADDRESSES` makes them read the client's
address from the balancer. The same parts on several machines: deploy/compose.yaml, deploy/helm/.
"""

from __future__ import annotations

import argparse
import contextlib
import secrets
import signal
import threading
from dataclasses import dataclass, field
from pathlib import Path

from harness.balancer import Balancer
from harness.postgres import PostgresCluster
from harness.router import VllmRouter
from harness.server import ROOT, AppServer, VllmServer
from services.config import Settings
from services.engine.backends.local.model_prep import ensure_default_model

REPLICAS = 2
ENGINE_SERVERS = 2


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
    admin_password: str = field(default_factory=lambda: secrets.token_urlsafe(12))
    ops_token: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    postgres: PostgresCluster | None = None
    engines: list[VllmServer] = field(default_factory=list)
    router: VllmRouter | None = None
    replicas: list[AppServer] = field(default_factory=list)
    balancer: Balancer | None = None

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

    def start(self) -> Topology:
        """Start every part, each once the one it needs answers; on a failure, stop what started."""
        if self.app_replicas not in (1, 2):
            raise ValueError("deploy/haproxy.cfg balances two replicas (or one, twice)")
        self.cookie_secret = secrets.token_urlsafe(48)
        try:
            self.postgres = PostgresCluster().start()
            database_url = self.postgres.create_database("chat")
            self.engines = [
                VllmServer(self.model_dir, self.logs / f"vllm-{i}.log", self.max_model_len, *self.engine_args)
                for i in range(1, self.engine_servers + 1)
            ]
            for engine in self.engines:
                engine.env.update(self.engine_env)
                engine.start()
            self.router = VllmRouter([e.url for e in self.engines], self.logs / "router.log").start()
            env = self.replica_env(database_url, self.router.url)
            numbers = range(1, self.app_replicas + 1)
            self.replicas = [AppServer(dict(env), self.logs / f"app-{i}.log") for i in numbers]
            for replica in self.replicas:
                replica.start()
            addresses = [f"127.0.0.1:{r.port}" for r in self.replicas]
            addresses *= 2 // len(addresses)  # haproxy.cfg names two: one replica (benchmarks) is both
            self.balancer = Balancer(addresses, self.logs / "haproxy.log", self.port).start()
        except BaseException:
            self.stop()
            raise
        return self

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
    args = parser.parse_args()
    model = args.model or ensure_default_model(Settings.from_env({}))
    topology = Topology(model, args.logs, args.max_model_len, args.port)
    print("[topology] starting PostgreSQL, 2 vLLM servers, vLLM's router, 2 app replicas, HAProxy")
    topology.start()
    print(
        f"[topology] open {topology.url} and sign in as admin / {topology.admin_password}\n"
        f"[topology] operators' routes: Authorization: Bearer {topology.ops_token}\n"
        f"[topology] logs in {args.logs}; Ctrl-C stops everything"
    )
    stopped = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stopped.set())
    try:
        stopped.wait()
    finally:
        topology.stop()


if __name__ == "__main__":
    main()
