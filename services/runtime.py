"""The composition root: every long-lived part of the service, built once with what it needs.

Two moments build it. At import (before Chainlit reads its callbacks), `set_up_people` builds sign-in
and history for the bind address, and `Runtime` what the routes need: metrics, status, the /v1 gate.
At start (Chainlit's startup hook), `Runtime.start` enters the engine's async context and builds,
top to bottom in `_serve`, everything that needs the engine: request metrics, admission, sessions,
chat, maintenance, the chat turns, the API's server. `stop` (Chainlit's shutdown hook) undoes it in
reverse; an atexit hook covers interpreter exits that skip the shutdown hook, so the engine's
processes never outlive the app. Nothing is set on a part after it is built: a part that needs what
exists only once the engine runs gets a provider (`running`).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import logging
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import psutil
from prometheus_client import CollectorRegistry

from services.accounts.keys import ApiKeyStore, KeyHolder
from services.accounts.local import load_or_create_token, token_banner
from services.accounts.modes import resolve_mode
from services.accounts.oauth import ask_github_for_org_memberships
from services.accounts.secret import ensure_auth_secret
from services.accounts.sign_in import SignIn
from services.accounts.store import AccountStore
from services.admission.service import Admission
from services.api.gate import GENERATING_PATHS, AdmitAll, Admitted, ApiGate, SharedAdmission
from services.api.metrics import ApiMetrics
from services.api.models import ModelsServer
from services.api.remote import RemoteApiServer
from services.api.server import OpenAiServer
from services.api.usage import AnswerMeter
from services.audit import actions
from services.audit.details import masked_settings
from services.audit.log import AuditLog
from services.chat.per_model import chats_per_model
from services.chat.service import ChatService
from services.chat.store import SessionStore
from services.chat.turns import ChatTurns, NothingKept
from services.config import Settings
from services.engine import ChatEngine, ServedModels, UnknownModelError, served_models_lifespan
from services.engine.backends.local import engine_processes
from services.history.database import ensure_data_dir
from services.history.replica_limits import shared_database, shared_limits, shared_line
from services.history.service import History, HistoryCollector
from services.observability.app_probe import start_app_probe
from services.observability.maintenance import Maintenance
from services.observability.metrics import RequestMetrics, ServiceCollector
from services.observability.ops_access import require_ops_token
from services.observability.report import StatsReport
from services.observability.status import ServiceStatus
from services.presets.store import PresetStore
from services.transfer.service import Transfers
from services.usage import UsageLedger, UsageStore
from services.usage.metrics import UsageCollector

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class People:
    """Who may sign in, and what is kept of their conversations, for one bind address."""

    sign_in: SignIn
    history: History


@dataclass(frozen=True)
class Serving:
    """The parts that exist while the engine runs, built together by `Runtime._serve`."""

    engine: ChatEngine
    engine_processes: list[psutil.Process]  # vLLM runs EngineCore and its workers as our children
    requests: RequestMetrics
    admission: Admission
    sessions: SessionStore
    chat: ChatService
    maintenance: Maintenance
    turns: ChatTurns
    api_admission: SharedAdmission | None  # the /v1 API's, when it is served
    usage: UsageLedger | None = None  # usage and budgets, when kept (a database, USAGE_ACCOUNTING)
    models: ServedModels | None = None  # every model served (MODELS), `engine` the default


def set_up_people(
    settings: Settings, bind_host: str, oauth_providers: list[str], bind_port: int = 8000
) -> People:
    """Sign-in and history for this bind address (at import, before Chainlit reads its callbacks).

    Raises SettingsError when a public address has no sign-in or no OPS_TOKEN, before anything is
    created. Creates the sign-in secret once, and in local mode the install's token (printed, with
    where to open the app).
    """
    mode = resolve_mode(settings, bind_host, oauth_providers)
    require_ops_token(settings, bind_host)
    keep = settings.chat_history and mode != "anonymous"
    history = History(settings, keep_conversations=keep, use_database=mode != "anonymous")
    accounts = AccountStore(history.engine) if history.engine is not None else None
    token = load_or_create_token(ensure_data_dir(settings)) if mode == "local" else None
    shared = shared_database(settings, history, "shared sign-in attempts")  # SHARED_LIMITS
    sign_in = SignIn(settings, mode, accounts, local_token=token, audit=history.audit, shared=shared)
    history.on_ready(sign_in.ensure_first_accounts)
    if history.audit is not None:
        audit = history.audit
        history.on_ready(lambda: _record_start(audit, settings, mode))
    if mode != "anonymous":
        source = ensure_auth_secret(ensure_data_dir(settings))
        logger.info("sign-in: %s mode; cookies signed with the secret from %s", mode, source)
    if token is not None:
        required = settings.local_token_required
        print(token_banner(bind_host, bind_port, token, required), file=sys.stderr, flush=True)
    if oauth_providers and mode in ("password", "oauth"):
        _set_up_oauth(settings, sign_in, oauth_providers)
    return People(sign_in, history)


async def _record_start(audit: AuditLog, settings: Settings, mode: str) -> None:
    """The audit log's entry for a start: the sign-in mode and the settings not at their defaults."""
    changed = masked_settings(settings.non_default())
    await audit.record(actions.SYSTEM, actions.SERVICE_STARTED, None, {"sign_in": mode, **changed})


def _set_up_oauth(settings: Settings, sign_in: SignIn, oauth_providers: list[str]) -> None:
    if sign_in.oauth_gate.allowlist.empty:
        logger.warning(
            "OAuth (%s) without OAUTH_ALLOWED_USERS, _DOMAINS or _ORGS: only identities an "
            "administrator linked may sign in",
            ", ".join(oauth_providers),
        )
    if "github" in oauth_providers and settings.oauth_allowed_orgs:
        ask_github_for_org_memberships()


class Runtime:
    """Owns the engine, the session store, maintenance and metrics for the life of the process."""

    def __init__(
        self,
        settings: Settings | None = None,
        people: People | None = None,
    ) -> None:
        """`people` None: nothing is kept and nobody signs in (tests and benchmarks of the engine side)."""
        self.settings: Settings = settings or Settings.from_env()  # read once, validated here
        self.round_steps: list[Callable[[], Awaitable[object]]] = []  # see run_each_round
        self.sign_in = people.sign_in if people is not None else None
        self.history = people.history if people is not None else None
        self.serving: Serving | None = None  # while the engine runs (start to stop)
        self.registry = CollectorRegistry()
        self.status = ServiceStatus(self.settings, self.history, self.running)
        self.registry.register(ServiceCollector(self.status))
        self.api = _api_gate(self.settings, self.history, self.registry, self.running)
        self.transfers = _transfers(self.settings, self.history)  # export, import, share links
        if self.history is not None:
            self.registry.register(HistoryCollector(self.history))
        self.report = StatsReport(self.status)
        # A person's default settings and prompt templates (services/presets), when there is a database.
        self.presets = (
            PresetStore(self.history.engine, self.settings) if self.history and self.history.engine else None
        )
        self._stack = contextlib.AsyncExitStack()

    def running(self) -> Serving | None:
        """The parts that need the engine; None before start and after stop."""
        return self.serving

    def run_each_round(self, *steps: Callable[[], Awaitable[object]]) -> None:
        """Add what the rooms above run each maintenance round (the web edge's upload sweep, the pages
        that left unseen); before `start`."""
        self.round_steps.extend(steps)

    async def start(self) -> None:
        """Start the history, the engine (warmed up) and everything that needs it."""
        logger.info("settings differing from defaults: %s", self.settings.non_default() or "none")
        for name in Settings.retired_in():
            logger.warning("%s is no longer a setting (a constant of the code now): ignored", name)
        if self.history is not None:
            await self.history.start()
            self._stack.push_async_callback(self.history.stop)
        models = await self._stack.enter_async_context(served_models_lifespan(self.settings))
        for _, engine in models:
            atexit.register(engine.shutdown)  # an exit that skips the shutdown hook
            self._stack.callback(atexit.unregister, engine.shutdown)
        self.serving = await self._serve(models)

    async def _serve(self, models: ServedModels) -> Serving:
        """Build and start what needs the engine, in order; each stop is pushed to undo it."""
        s = self.settings
        stack = self._stack
        engine = models.default
        processes = engine_processes()
        requests = RequestMetrics()
        self.registry.register(requests)
        stack.callback(self.registry.unregister, requests)
        usage = self._usage()
        admission = self._admission(models, requests, usage)
        sessions = SessionStore(s)
        chats = chats_per_model(models, admission, s, stack)
        models.on_added(lambda _, each: stack.callback(each.on_finish(requests.record)))
        models.on_added(lambda _, each: stack.callback(each.on_finish(admission.engine_finished)))
        chat = chats[models.default_name]
        maintenance = Maintenance(s, sessions, engine, self._maintenance_steps(models, usage))
        maintenance.start()
        models.on_added(lambda _, each: maintenance.add_steps(*_word_cache_rounds(each)))
        stack.push_async_callback(maintenance.stop)
        turns = ChatTurns(sessions, admission, chat, self.history or NothingKept(), chats)
        _app_probe(s)
        api_admission = await self._api_server(models, admission)
        return Serving(
            engine,
            processes,
            requests,
            admission,
            sessions,
            chat,
            maintenance,
            turns,
            api_admission,
            usage,
            models,
        )

    def _admission(
        self, models: ServedModels, requests: RequestMetrics, usage: UsageLedger | None
    ) -> Admission:
        """The one admission door for every model, started, its running limit following the default
        model's speed; every model's finished requests feed the request metrics and admission."""
        s = self.settings
        stack = self._stack
        engine = models.default
        shared = shared_limits(s, self.history, stack)  # SHARED_LIMITS
        admission = Admission(s, engine.load, _max_running(s), usage, shared)
        for _, each in models:
            stack.callback(each.on_finish(requests.record))
            stack.callback(each.on_finish(admission.engine_finished))  # chat's tokens, for usage
        if engine.warm_up_report is not None:
            admission.learn_from_warm_up(engine.warm_up_report.decode_seconds_per_token)
        admission.start()
        stack.push_async_callback(admission.stop)
        admission.shared_line = shared_line(s, self.history, admission.line, stack)  # SHARED_LINE_SECONDS
        return admission

    async def _api_server(self, models: ServedModels, admission: Admission) -> SharedAdmission | None:
        """Start the /v1 API's server, if the API is on; its admission: the same queue, priority and
        per-user limits as chat."""
        if self.api is None:
            return None
        engine = models.default
        context_of = functools.partial(_context_of, models)
        api_admission = SharedAdmission(admission, engine.count_tokens, context_of)
        await self.api.server.start(
            models if len(models) > 1 or self.settings.engine_url_list else engine.backend
        )
        self._stack.push_async_callback(self.api.server.stop)
        return api_admission

    def _usage(self) -> UsageLedger | None:
        """Usage and budgets (services/usage), started, with their stop pushed; None without a database
        or with USAGE_ACCOUNTING=false."""
        history = self.history
        if not self.settings.usage_accounting or history is None or history.engine is None:
            return None
        usage = UsageLedger(
            self.settings, UsageStore(history.engine), lambda: history.migrated and history.health.available
        )
        usage.start()
        self._stack.push_async_callback(usage.stop)  # writes what is still counted
        collector = UsageCollector(usage)
        self.registry.register(collector)
        self._stack.callback(self.registry.unregister, collector)
        return usage

    def _maintenance_steps(self, models: ServedModels, usage: UsageLedger | None) -> list[Callable]:
        """What each maintenance round also runs: the copies vLLM's tokenizer pool adds
        (word_caches.py, every model's), the audit log's retention, the history's and usage's, and the
        rooms' above (`run_each_round`)."""
        steps: list[Callable] = [step for _, each in models for step in _word_cache_rounds(each)]
        if self.history is not None and self.history.audit is not None:
            steps.append(self.history.audit.retention_round)
        steps += [self.history.retention_round] if self.history is not None else []
        steps += [usage.retention_round] if usage is not None else []
        if self.settings.engine_url_list:  # the servers' health for /metrics, asked or not by /healthz
            steps.append(functools.partial(_check_quietly, models.default))
        return steps + list(self.round_steps)

    async def stop(self) -> None:
        """Say not ready, stop maintenance, cancel every turn, drop every session, stop the engine."""
        self.status.draining = True
        serving, self.serving = self.serving, None
        if serving is not None:
            await serving.maintenance.stop()
        await self.status.close()
        if serving is not None:
            serving.sessions.close_all()
        await self._stack.aclose()


def _transfers(settings: Settings, history: History | None) -> Transfers | None:
    """Export, import and share links, where conversations are kept."""
    if history is None or not history.enabled or history.engine is None:
        return None
    return Transfers(history.engine, settings, history.audit)


def _app_probe(settings: Settings) -> None:
    """The memory probe in the app's own process, when DIAGNOSTICS asks for it."""
    if settings.app_memory_probe_dir:
        start_app_probe(
            settings.app_memory_probe_dir,
            settings.app_memory_probe_seconds,
            settings.app_memory_probe_frames,
            settings.app_memory_probe_deep,
        )


async def _check_quietly(engine: ChatEngine) -> None:
    """A health check whose failure is only recorded (RemoteLLM.servers_answering)."""
    with contextlib.suppress(Exception):
        await engine.check_health()


def _word_cache_rounds(engine: ChatEngine) -> list[Callable]:
    return [engine.word_caches.round] if engine.word_caches is not None else []


def _context_of(models: ServedModels, name: object) -> int:
    """The context window of the model an API request names; the longest served for another name."""
    try:
        return models.get(name).max_model_len
    except UnknownModelError:
        return max(engine.max_model_len for _, engine in models)


def _max_running(settings: Settings) -> int:
    """The most requests admission may ever run at once: the engine's batch, per server."""
    return settings.max_num_seqs * max(1, len(settings.engine_url_list))


def _api_gate(
    settings: Settings,
    history: History | None,
    registry: CollectorRegistry,
    running: Callable[[], Serving | None],
) -> ApiGate | None:
    """The /v1 API's one door (services/api/gate.py), over vLLM's layer or the ENGINE_URLS servers' own."""
    if not settings.api_enabled:
        return None
    if settings.engine_url_list:
        server: RemoteApiServer | OpenAiServer | ModelsServer = RemoteApiServer(settings)
    else:
        server = ModelsServer(settings) if len(settings.model_list) > 1 else OpenAiServer(settings)
    keys = ApiKeyStore(history.engine, settings.api_keys_per_user) if history and history.engine else None
    return ApiGate(settings, server, ApiMetrics(registry), keys, _AdmissionWhenServing(running))


class _AdmissionWhenServing:
    """The API gate's admission, which exists once the engine runs (the gate answers 503 before)."""

    def __init__(self, running: Callable[[], Serving | None]) -> None:
        self._running = running

    def _current(self) -> SharedAdmission | AdmitAll:
        serving = self._running()
        return serving.api_admission if serving is not None and serving.api_admission else AdmitAll()

    def admit(
        self, holder: KeyHolder, answer: AnswerMeter, path: str = GENERATING_PATHS[0]
    ) -> contextlib.AbstractAsyncContextManager[Admitted]:
        return self._current().admit(holder, answer, path)
