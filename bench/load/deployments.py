"""Where an overload arm's people go (bench/load/overload.py), and what is read from it afterwards.

    single    one `chainlit run` with its in-process engine (the default model), SQLite, the local
              user (people told apart by address)
    replicas  deploy/topology.py's scale-out on this machine: HAProxy (sticky cookie) -> 2 app
              replicas -> vLLM's router -> `vllm serve`, one PostgreSQL; password sign-in, one
              account per person (as the topology runs: a balancer in front rules out local mode)

The engine servers get the in-process engine's defaults as `vllm serve` options and environment
(dtype, batch, prefill pieces, block size, priority scheduling, queue bound, KV pool, OpenMP threads
on every core, its allocator), so the two differ in the tiers in front of the engine, not in the
engine. One engine server by default: on 2 cores, a second `vllm serve` runs its threads on the
same two cores (each one binds all of them), so the pair has no more compute than one, and each
holds its own weights and KV pool (several GB more); the comparison would measure the cores split
between two engines, not the balancer and the replicas. `--engine-servers 2` runs the topology as
deploy/topology.py builds it, for a machine with the cores for it.

Read through every part: vLLM's token counters from the engine servers' /metrics (the replicas'
own /metrics have none in remote mode), refusals summed over the replicas' /metrics, rows from
PostgreSQL, memory of the replicas and the engine servers (apart and summed), each replica's
/status after the load, and the replicas' own CPU.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import re
import secrets
import sqlite3
import subprocess
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from harness.chat_client import local_cookie
from harness.server import AppServer, VllmServer

INTER_TOKEN = "vllm:inter_token_latency_seconds"  # a histogram: its _sum and _count
TOKEN_COUNTERS = (
    "vllm:generation_tokens_total",
    "vllm:prompt_tokens_total",
    "vllm:prompt_tokens_cached_total",  # of the prompt tokens, those the prefix cache held
    f"{INTER_TOKEN}_sum",
    f"{INTER_TOKEN}_count",
)
REFUSALS = "chat_admission_refusals_total"
COUNTERS = (*TOKEN_COUNTERS, REFUSALS)
TABLES = ("threads", "steps")
SUMMED_STATUS = (
    "engine_unfinished_requests",
    "sessions",
    "sessions_awaiting_reconnect",
    "turns_in_flight",
    "sessions_dropped_total",
)
MARKED_DOWN = re.compile(r"^\[WARNING\]\s+\(\d+\) : Server \w+/(\w+) is DOWN\b.*?(\d+) sessions active", re.M)
ACCOUNT_PREFIX = "person-"  # the replicas' people sign in as person-1, person-2, ...
PASSWORD_ENV = "OVERLOAD_ACCOUNT_PASSWORD"  # their password, to Locust's people (not on a command line)
REPLICA_COOKIE = "CHAT_REPLICA"  # deploy/haproxy.cfg's sticky cookie: which replica a person is on


def sum_counters(texts: Iterable[str], names: Iterable[str]) -> dict[str, float]:
    """The counters `names` in Prometheus texts, summed over labels and over the texts (processes)."""
    from prometheus_client.parser import text_string_to_metric_families

    values = dict.fromkeys(names, 0.0)
    for text in texts:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in values:
                    values[sample.name] += sample.value
    return values


def replica_of(cookie: str | None) -> str:
    """The replica the balancer's sticky cookie names in a Cookie header ("" without a balancer)."""
    for part in (cookie or "").split(";"):
        name, _, value = part.strip().partition("=")
        if name == REPLICA_COOKIE:
            return value
    return ""


def merged_cookie(cookie: str, set_cookies: dict[str, str]) -> str:
    """A Cookie header after a response set `set_cookies`, as a browser's jar keeps them."""
    jar = dict(part.strip().partition("=")[::2] for part in cookie.split(";") if part.strip())
    jar.update(set_cookies)
    return "; ".join(f"{name}={value}" for name, value in jar.items())


def person_address(number: int) -> str:
    """The address person `number` of a load comes from (each their own: sign-in limits count by it)."""
    return f"10.77.{number // 250}.{number % 250 + 1}"


def browser_cookie(base_url: str, address: str, username: str, password: str) -> str | None:
    """The Cookie header a person's browser sends: the local user's sign-in (no `username`), or
    `username`'s password sign-in with every cookie its answer set (the balancer's sticky one too)."""
    if not username:
        return local_cookie(base_url)
    response = httpx.post(
        f"{base_url}/login",
        data={"username": username, "password": password},
        headers={"X-Forwarded-For": address},
        timeout=60,
    )
    response.raise_for_status()
    return "; ".join(f"{name}={value}" for name, value in response.cookies.items())


def signed_in_cookies(base_url: str, accounts: str, people: int, password: str) -> dict[str, str]:
    """Person number -> their sign-in's cookies, made before a load starts, two at a time: browsers
    keep their sign-in across visits, so the load measures chatting, not 50 argon2 checks (0.3 s of
    CPU each) at once in its first seconds."""

    def one(number: int) -> tuple[str, str]:
        cookie = browser_cookie(base_url, person_address(number), f"{accounts}{number}", password)
        return str(number), cookie or ""

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        return dict(pool.map(one, range(1, people + 1)))


def combined_status(statuses: list[dict[str, Any]]) -> dict[str, Any]:
    """The replicas' /status as one: counts summed (`added`; None when a replica did not say), the
    longest event-loop lag, each one's admission state."""
    combined = {name: added([status.get(name) for status in statuses]) for name in SUMMED_STATUS}
    lags = [lag for status in statuses if (lag := status.get("event_loop_lag_max_seconds")) is not None]
    combined["event_loop_lag_max_seconds"] = max(lags, default=None)
    admission = [status.get("admission") for status in statuses]
    combined["admission"] = admission[0] if len(admission) == 1 else admission
    return combined


def added(values: list[Any]) -> Any:
    """Counts summed; counts by kind ({reason: count}) summed kind by kind; None if any is None."""
    if any(value is None for value in values):
        return None
    if all(isinstance(value, dict) for value in values):
        return {key: added([value.get(key, 0) for value in values]) for key in sorted(set().union(*values))}
    return sum(values)


def marked_down(haproxy_log: str) -> dict[str, dict[str, int]]:
    """Each time HAProxy marked a replica down (its /readyz check failed or timed out), with the
    sessions it held then: deploy/haproxy.cfg cuts them (on-marked-down shutdown-sessions)."""
    downs: dict[str, dict[str, int]] = {}
    for replica, sessions in MARKED_DOWN.findall(haproxy_log):
        entry = downs.setdefault(replica, {"times": 0, "sessions_cut": 0})
        entry["times"] += 1
        entry["sessions_cut"] += int(sessions)
    return downs


def tree_rss_mb(pid: int) -> float:
    """Resident memory of a process and every process under it, in MB."""
    root = psutil.Process(pid)
    total = 0
    for process in [root, *root.children(recursive=True)]:
        try:
            total += process.memory_info().rss
        except psutil.Error:
            continue
    return total / 2**20


def read_metrics(url: str, token: str = "") -> str:
    request = urllib.request.Request(f"{url}/metrics")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.read().decode()


@dataclass
class Deployment:
    """The app's processes people reach at `url`, the engine servers behind them (none: in-process)."""

    url: str
    apps: list[AppServer]
    engines: list[VllmServer] = field(default_factory=list)
    topology: Any = None  # deploy.topology.Topology, stopped with the deployment
    accounts: str = ""  # the people's account prefix ("": the local user)
    password: str = ""

    def counters(self) -> dict[str, float]:
        """vLLM's token and inter-token latency counters (engine servers', else the app's) and the
        refusals over the apps."""
        app_texts = [read_metrics(app.base_url, app.env.get("OPS_TOKEN", "")) for app in self.apps]
        engine_texts = [read_metrics(engine.url) for engine in self.engines] or app_texts
        return {**sum_counters(engine_texts, TOKEN_COUNTERS), **sum_counters(app_texts, (REFUSALS,))}

    def rss_mb(self) -> dict[str, float]:
        """Resident memory of the apps' trees (the in-process engine's too) and the engine servers'."""
        parts = {"apps": sum(tree_rss_mb(app.process.pid) for app in self.apps if app.process)}
        if self.engines:
            parts["engine_servers"] = sum(tree_rss_mb(e.process.pid) for e in self.engines if e.process)
        return {name: round(value, 1) for name, value in parts.items()}

    def stored_rows(self) -> dict[str, int]:
        """Conversations and steps (messages) in the app's database: SQLite, or the topology's PostgreSQL."""
        if self.topology is not None:
            return postgres_rows(self.topology.postgres)
        path = Path(self.apps[0].env["DATA_DIR"]) / "chat.db"
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
            return {table: db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0] for table in TABLES}

    def app_cpu_seconds(self) -> float:
        """CPU time of the apps' own processes (not the in-process engine's)."""
        times = [psutil.Process(app.process.pid).cpu_times() for app in self.apps if app.process]
        return sum(t.user + t.system for t in times)

    def statuses(self) -> list[dict[str, Any]]:
        return [app.status() for app in self.apps]

    def engine_requests_held(self) -> float | None:
        """Running plus waiting requests in the engine servers (None: the engine is in-process)."""
        return sum(engine.requests_held() for engine in self.engines) if self.engines else None

    def balancer_log(self) -> str:
        """HAProxy's log so far ("" without a balancer)."""
        balancer = getattr(self.topology, "balancer", None)
        if balancer is None or not balancer.log_path.exists():
            return ""
        return balancer.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.topology is not None:
            self.topology.stop()  # the replicas too
            return
        for app in self.apps:
            app.stop()


def postgres_rows(cluster: Any) -> dict[str, int]:
    """Row counts of TABLES in the topology's database, by psql."""
    query = "SELECT " + ", ".join(f"(SELECT COUNT(*) FROM {table})" for table in TABLES)
    command = [
        str(cluster.bin_dir / "psql"),
        "-h",
        "127.0.0.1",
        "-p",
        str(cluster.port),
        "-U",
        "postgres",
        "-d",
        "chat",
        "-At",
        "-c",
        query,
    ]
    output = subprocess.run(command, check=True, capture_output=True, text=True, timeout=60).stdout
    return dict(zip(TABLES, (int(n) for n in output.strip().split("|")), strict=True))


def start_single(settings: dict[str, str], log: Path) -> Deployment:
    server = AppServer(dict(settings), log).start(timeout=900)
    return Deployment(server.base_url, [server])


def engine_server_options(settings: Any) -> tuple[tuple[str, ...], dict[str, str]]:
    """`vllm serve` options and environment that give an engine server the in-process engine's
    defaults (services/engine/backends/local/engine.py: engine_args, prepare_process_env)."""
    from services.engine.backends.local.engine import auto_dtype, worker_thread_env
    from services.memory.allocators import engine_memory_env

    s = settings
    args = [
        "--dtype",
        auto_dtype() if s.dtype == "auto" else s.dtype,
        "--max-num-seqs",
        str(s.max_num_seqs),
        "--max-num-batched-tokens",
        str(s.max_num_batched_tokens),
    ]
    for option, value in (
        ("--long-prefill-token-threshold", s.long_prefill_token_threshold),
        ("--block-size", s.block_size),
        ("--max-num-queued-reqs", s.max_num_queued_reqs),
        ("--max-num-queued-tokens", s.max_num_queued_tokens),
    ):
        if value:
            args += [option, str(value)]
    args += ["--scheduling-policy", "priority" if s.priority_scheduling else "fcfs"]
    env = {
        "VLLM_CPU_KVCACHE_SPACE": str(s.cpu_kvcache_space_gib),
        "TORCHINDUCTOR_CACHE_DIR": str(Path(s.cache_dir) / "torchinductor"),
        **worker_thread_env(os.sched_getaffinity(0)),
        **engine_memory_env(s, dict(os.environ)),
    }
    return tuple(args), env


def start_replicas(
    settings: dict[str, str], logs: Path, people: int, engine_servers: int = 1, app_replicas: int = 2
) -> Deployment:
    """deploy/topology.py's parts with the arm's settings on every replica, and `people` accounts."""
    from deploy.topology import Topology
    from services.config import Settings
    from services.engine.backends.local.model_prep import ensure_default_model

    app_settings = Settings.from_env(settings)
    args, env = engine_server_options(app_settings)
    topology = Topology(
        ensure_default_model(app_settings),
        logs,
        app_settings.max_model_len,
        app_env=dict(settings),
        engine_servers=engine_servers,
        app_replicas=app_replicas,
        engine_args=args,
        engine_env=env,
    )
    topology.start()
    password = secrets.token_urlsafe(16)
    try:
        assert topology.postgres is not None
        asyncio.run(add_accounts(topology.postgres.url("chat"), people, password))
    except BaseException:
        topology.stop()
        raise
    return Deployment(
        topology.url, list(topology.replicas), list(topology.engines), topology, ACCOUNT_PREFIX, password
    )


async def add_accounts(database_url: str, people: int, password: str) -> None:
    """person-1 .. person-<people>, with `password`, in the replicas' database."""
    from services.accounts.store import AccountStore
    from services.config import Settings
    from services.history.database import create_engine

    engine = create_engine(Settings.from_env({"DATABASE_URL": database_url}))
    try:
        store = AccountStore(engine)
        for number in range(1, people + 1):
            await store.add(f"{ACCOUNT_PREFIX}{number}", password)
    finally:
        await engine.dispose()
