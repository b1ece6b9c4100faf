"""The service's long-lived parts and their one lifecycle: settings, engine, sessions, chat, maintenance.

Chainlit's startup hook calls `start`, its shutdown hook calls `stop`; an
atexit hook covers interpreter exits that skip the shutdown hook, so the
engine's processes never outlive the app. Everything `start` creates is
undone by `stop`, in reverse order: maintenance tasks, metric listeners,
sessions, engine.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import sys
import time
from typing import Any

import psutil
from prometheus_client import CollectorRegistry

from services.accounts.keys import ApiKeyStore
from services.accounts.local import load_or_create_token, token_banner
from services.accounts.oauth import ask_github_for_org_memberships
from services.accounts.secret import ensure_auth_secret
from services.accounts.sign_in import SignIn, resolve_mode
from services.accounts.store import AccountStore
from services.admission.service import Admission
from services.admission.waiting_line import CHAT, DOCUMENT
from services.api.gate import ApiGate, SharedAdmission
from services.api.metrics import ApiMetrics
from services.api.remote import RemoteApiServer
from services.api.server import OpenAiServer
from services.chat.service import ChatService
from services.chat.store import SessionStore
from services.config import Settings
from services.engine import ChatEngine, WarmUpReport, engine_lifespan
from services.engine.backends.local import engine_processes, is_running
from services.history.database import ensure_data_dir
from services.history.service import History, HistoryCollector
from services.memory import pymalloc_counters
from services.observability.app_probe import start_app_probe
from services.observability.maintenance import Maintenance, malloc_info
from services.observability.metrics import RequestMetrics, ServiceCollector
from services.observability.ops_access import require_ops_token
from services.observability.report import StatsReport

logger = logging.getLogger(__name__)


class Runtime:
    """Owns the engine, the session store, maintenance and metrics for the life of the process."""

    def __init__(self, settings: Settings | None = None) -> None:
        self._stack = contextlib.AsyncExitStack()
        self.settings: Settings = settings or Settings.from_env()  # read once, validated here
        self.engine: ChatEngine | None = None
        self.sessions: SessionStore | None = None
        self.chat: ChatService | None = None
        self.maintenance: Maintenance | None = None
        self.admission: Admission | None = None
        self.warm_up: WarmUpReport | None = None
        self.requests: RequestMetrics | None = None
        self.engine_processes: list[psutil.Process] = []
        self.registry = CollectorRegistry()
        self.registry.register(ServiceCollector(self))
        self.started_at = time.time()
        self.report = StatsReport(self)
        self._ping: asyncio.Task | None = None
        self.history: History | None = None
        self.sign_in: SignIn | None = None
        self.api: ApiGate | None = None  # the /v1 API's one door (services/api/gate.py)
        if self.settings.api_enabled:
            remote = bool(self.settings.engine_url_list)  # their own /v1, else vLLM's layer over our engine
            server = RemoteApiServer(self.settings) if remote else OpenAiServer(self.settings)
            self.api = ApiGate(self.settings, server, ApiMetrics(self.registry))

    def set_up_people(self, bind_host: str, oauth_providers: list[str], bind_port: int = 8000) -> SignIn:
        """Sign-in and history for this bind address (at import, before Chainlit reads its callbacks).

        Raises SettingsError when a public address has no sign-in or no OPS_TOKEN, before anything is
        created. Creates the sign-in secret once, and in local mode the install's token (printed, with
        where to open the app).
        """
        mode = resolve_mode(self.settings, bind_host, oauth_providers)
        require_ops_token(self.settings, bind_host)
        keep = self.settings.chat_history and mode != "anonymous"
        self.history = History(self.settings, keep_conversations=keep, use_database=mode != "anonymous")
        accounts = AccountStore(self.history.engine) if self.history.engine is not None else None
        token = load_or_create_token(ensure_data_dir(self.settings)) if mode == "local" else None
        self.sign_in = SignIn(self.settings, mode, accounts, local_token=token)
        self.history.on_ready(self.sign_in.ensure_first_accounts)
        if self.api is not None and self.history.engine is not None:
            self.api.keys = ApiKeyStore(self.history.engine, self.settings.api_keys_per_user)
        if mode != "anonymous":
            source = ensure_auth_secret(ensure_data_dir(self.settings))
            logger.info("sign-in: %s mode; cookies signed with the secret from %s", mode, source)
        if token is not None:
            required = self.settings.local_token_required
            print(token_banner(bind_host, bind_port, token, required), file=sys.stderr, flush=True)
        if oauth_providers and mode in ("password", "oauth"):
            self._set_up_oauth(oauth_providers)
        self.registry.register(HistoryCollector(self.history))
        return self.sign_in

    def _set_up_oauth(self, oauth_providers: list[str]) -> None:
        assert self.sign_in is not None
        if self.sign_in.oauth_gate.allowlist.empty:
            logger.warning("OAuth (%s) without OAUTH_ALLOWED_USERS, _DOMAINS or _ORGS: only identities an "
                           "administrator linked may sign in", ", ".join(oauth_providers))  # fmt: skip
        if "github" in oauth_providers and self.settings.oauth_allowed_orgs:
            ask_github_for_org_memberships()

    @property
    def ready(self) -> bool:
        return self.sessions is not None

    @property
    def uptime_seconds(self) -> float:
        return time.time() - self.started_at

    async def start(self, settings: Settings | None = None) -> None:
        """Start the engine, create the session store, start maintenance (`settings` overrides)."""
        self.settings = settings or self.settings
        logger.info("settings differing from defaults: %s", self.settings.non_default() or "none")
        if self.history is not None:
            await self.history.start()
            self._stack.push_async_callback(self.history.stop)
        self.engine = await self._stack.enter_async_context(engine_lifespan(self.settings))
        atexit.register(self._shutdown_at_exit)
        self.warm_up = self.engine.warm_up_report  # the lifespan warmed it up before yielding it
        # vLLM runs EngineCore and its workers as children of this process.
        self.engine_processes = engine_processes()
        self.requests = RequestMetrics(self.settings.latency_samples_kept)
        self.registry.register(self.requests)
        self._stack.callback(self.registry.unregister, self.requests)
        self._stack.callback(self.engine.on_finish(self.requests.record))
        self.sessions = SessionStore(self.settings)
        self.admission = Admission(self.settings, self.engine.load, self._max_running())
        if self.warm_up is not None:
            self.admission.learn_from_warm_up(self.warm_up.decode_seconds_per_token)
        self.admission.start()
        self._stack.push_async_callback(self.admission.stop)
        chat_engine, document_engine = (self.admission.engine(self.engine, kind) for kind in (CHAT, DOCUMENT))
        self.chat = ChatService(chat_engine, self.settings, document_engine)
        self._stack.callback(self.chat.summarizer.close)  # its prefill meter listens to the engine
        word_caches = self.engine.word_caches  # the copies vLLM's tokenizer pool adds (word_caches.py)
        steps = [word_caches.round] if word_caches is not None else []
        steps += [self.history.retention_round] if self.history is not None else []
        self.maintenance = Maintenance(self.settings, self.sessions, self.engine, steps)
        self.maintenance.start()
        self._stack.push_async_callback(self.maintenance.stop)
        if self.settings.app_memory_probe_dir:
            start_app_probe(
                self.settings.app_memory_probe_dir,
                self.settings.app_memory_probe_seconds,
                self.settings.app_memory_probe_frames,
                self.settings.app_memory_probe_deep,
            )
        await self._start_api()

    async def _start_api(self) -> None:
        """The /v1 API behind its gate, over the engine (in-process, or the ENGINE_URLS servers)."""
        if self.api is None or self.engine is None:
            return
        if self.admission is not None:  # the same queue, priority and per-user limits as chat
            self.api.admission = SharedAdmission(self.admission, self.engine.count_tokens)
        await self.api.server.start(self.engine.backend)
        self._stack.push_async_callback(self.api.server.stop)

    async def stop(self) -> None:
        """Stop maintenance, cancel every turn, drop every session, shut the engine down."""
        if self.maintenance is not None:
            await self.maintenance.stop()
        if self._ping is not None:
            self._ping.cancel()
            await asyncio.gather(self._ping, return_exceptions=True)
            self._ping = None
        if self.sessions is not None:
            self.sessions.close_all()
        self.sessions = self.chat = None
        await self._stack.aclose()
        self.admission = None
        self.engine = None
        self.maintenance = None
        self.requests = None
        self.engine_processes = []
        atexit.unregister(self._shutdown_at_exit)

    def _max_running(self) -> int:
        """The most requests admission may ever run at once: the engine's batch, per server."""
        return self.settings.max_num_seqs * max(1, len(self.settings.engine_url_list))

    def _shutdown_at_exit(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()

    def status(self) -> dict[str, Any]:
        """Counts that show whether anything is held that should not be."""
        if not self.ready:
            return {"ready": False}
        assert self.engine is not None and self.sessions is not None and self.chat is not None
        summaries = self.chat.summarizer.cache
        status = {
            "ready": True,
            "engine_alive": self.engine.alive,
            "engine_unfinished_requests": self.engine.unfinished_requests(),
            "sessions": len(self.sessions),
            "sessions_awaiting_reconnect": self.sessions.awaiting_reconnect(),
            "turns_in_flight": self.sessions.turns_in_flight(),
            "sessions_dropped_total": dict(self.sessions.dropped_total),
            "sessions_refused_total": self.sessions.refused_total,
            "summary_cache": {"entries": len(summaries), "bytes": summaries.size_bytes},
            "history": self.history.status() if self.history is not None else {"enabled": False},
            "uptime_seconds": round(self.uptime_seconds, 1),
        }
        if self.admission is not None:
            status["admission"] = self.admission.status()
        if self.warm_up is not None:
            status["warm_up"] = self.warm_up.summary()
        if self.maintenance is not None:
            memory = self.maintenance.memory
            status.update(
                {
                    "maintenance_rounds": self.maintenance.rounds,
                    "memory_growth_mb_per_hour": memory.slope_mb_per_hour,
                    "memory_leak_alarm": memory.alarm,
                    "event_loop_lag_max_seconds": round(self.maintenance.loop_lag.max_seconds, 4),
                    "app_malloc": malloc_info(),
                    "app_python_allocated_blocks": sys.getallocatedblocks(),
                    "app_pymalloc": pymalloc_counters(),
                    "app_asyncio_tasks": len(asyncio.all_tasks()),
                    "app_tokenizer_copies": self._tokenizer_copies(),
                }
            )
        return status

    def _tokenizer_copies(self) -> int | None:
        """Tokenizer copies alive in vLLM's pool (~8 MB each with the default model); None if unknown."""
        word_caches = self.engine.word_caches if self.engine is not None else None
        return word_caches.copies_alive if word_caches is not None else None

    async def health(self) -> tuple[bool, dict[str, Any]]:
        """(healthy, detail) for /healthz; detail["status"] is "ok", "overloaded" or "down".

        Down: not started or warming up, or the engine is dead or does not answer.
        Overloaded: serving, but turns wait in our queue or were refused for capacity
        lately. Load balancers keep an overloaded replica (taking it out would push
        its load onto the others); /healthz answers 503 only when it is down.
        """
        healthy, detail = await self._engine_health()
        if not healthy:
            return False, {"status": "down", **detail}
        overloaded = self.admission is not None and self.admission.overloaded
        return True, {"status": "overloaded" if overloaded else "ok", **detail}

    async def _engine_health(self) -> tuple[bool, dict[str, Any]]:
        """The engine is alive, its processes run, and it answers.

        "Answers" means it produced output in the last HEALTH_RECENT_OUTPUT_SECONDS,
        or a one-token ping succeeds now (concurrent checks share one ping).
        """
        if not self.ready or self.engine is None:
            return False, {"ready": False}
        engine = self.engine
        processes = {p.pid: is_running(p) for p in self.engine_processes}
        detail: dict[str, Any] = {
            "ready": True,
            "engine_alive": engine.alive,
            "engine_processes": [{"pid": pid, "running": running} for pid, running in processes.items()],
            "engine_unfinished_requests": engine.unfinished_requests(),
        }
        if not engine.alive or not all(processes.values()):
            return False, {**detail, "error": "the engine process is not running"}
        try:
            await engine.check_health()
        except Exception as error:
            return False, {**detail, "error": f"engine check failed: {type(error).__name__}"}
        age = None if engine.last_output_at is None else time.monotonic() - engine.last_output_at
        if age is not None and age <= self.settings.health_recent_output_seconds:
            return True, {**detail, "last_output_seconds_ago": round(age, 2)}
        if self._ping is None or self._ping.done():
            timeout = self.settings.health_ping_timeout_seconds
            self._ping = asyncio.create_task(engine.ping(timeout), name="healthz-ping")
        try:
            seconds = await asyncio.shield(self._ping)
        except Exception as error:
            return False, {**detail, "error": f"engine did not answer a ping: {type(error).__name__}"}
        return True, {**detail, "ping_seconds": round(seconds, 3)}
