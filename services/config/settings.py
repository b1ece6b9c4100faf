"""The one settings object: every limit and engine option, read from env vars.

Each concern declares its settings in its own section (engine, chat,
documents, admission, api, accounts, history, observability, web, diagnostics);
`Settings` joins them into one frozen object. Each setting has a tier:
essential (what a deployer must know: the README lists them), tuning, or
diagnostic.
Engine options carry the names of vLLM's ``AsyncEngineArgs`` fields
(upper-cased as env vars), so vLLM's own documentation explains them. Values
are parsed and validated once, at startup, and a bad value stops the app with
a message that names the variable, the value and what was expected.

    python -m services.config.settings    # writes docs/settings.md and README's essential table
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from services.config.accounts import AUTH_MODES, AccountSettings
from services.config.admission import SHARED_LIMITS_MODES, AdmissionSettings, is_postgres
from services.config.api import ApiSettings
from services.config.audit import AuditSettings
from services.config.chat import ChatSettings
from services.config.diagnostics import DIAGNOSTIC_LEVELS, DiagnosticSettings
from services.config.documents import DocumentSettings
from services.config.engine import ENGINE_ALLOCATORS, ENGINE_MODELS_MAX, EngineSettings
from services.config.fields import SettingsError, parse
from services.config.history import HistorySettings
from services.config.ldap import LdapSettings, check_ldap
from services.config.observability import ObservabilitySettings
from services.config.presets import PresetSettings
from services.config.reference import Section, write_generated
from services.config.transfer import TransferSettings
from services.config.usage import UsageSettings
from services.config.web import WebSettings, parse_origins

SENSITIVE_SUFFIXES = ("_TOKEN", "_SECRET", "PASSWORD", "_KEY")
SENSITIVE_NAMES = ("DATABASE_URL",)  # may carry a password


# Former settings, now constants of the code next to their use (docs/settings.md names none of them):
# a deployment that still sets one is told at start that it has no effect. (ENGINE_ONEDNN_MM_CACHE is
# not here: the app sets it itself for vLLM's processes.)
RETIRED_SETTINGS = (
    "ADMIN_LIST_MAX_ROWS",
    "ANSWER_TOKEN_CACHE_TOKENS",
    "AUDIT_DETAILS_MAX_BYTES",
    "ENGINE_AFFINITY_SLACK",
    "ENGINE_MMAP_THRESHOLD_BYTES",
    "ENGINE_MODELS_MAX",
    "ENGINE_ONEDNN_CACHE_CAPACITY",
    "FOLLOW_UP_TURNS",
    "FOLLOW_UP_TURN_TOKENS",
    "HEALTH_RECENT_OUTPUT_SECONDS",
    "HISTORY_RETENTION_INTERVAL_SECONDS",
    "LATENCY_SAMPLES_KEPT",
    "LEAK_WARMUP_SECONDS",
    "LEAK_WINDOW_SECONDS",
    "LOOP_GUARD_ECHO_SENTENCE_SHARE",
    "LOOP_GUARD_ECHO_SHARE",
    "LOOP_GUARD_ECHO_WINDOW",
    "LOOP_GUARD_MAX_PERIOD_TOKENS",
    "LOOP_GUARD_MIN_REPEATS",
    "MAX_JSON_DEPTH",
    "MAX_PREFILLING_REQUESTS",
    "MAX_SESSIONS_AWAITING_RECONNECT",
    "MAX_THREAD_NAME_CHARS",
    "MEMORY_SAMPLES_KEPT",
    "PRESETS_MAX_NAME_CHARS",
    "PROGRESS_INTERVAL_SECONDS",
    "READING_PACE_HEADROOM",
    "RETRIEVAL_TOP_K",
    "SHARED_LEASE_SECONDS",
    "SQLITE_CACHE_KIB",
    "SUMMARY_CACHE_BYTES",
    "SUMMARY_CACHE_ENTRIES",
    "SUMMARY_CACHE_TTL_SECONDS",
    "SUMMARY_LOOP_RECOVERIES",
    "SUMMARY_MAP_TOKENS",
    "SUMMARY_MIN_TOKENS",
    "THREAD_LIST_PAGE_MAX",
    "THREAD_SEARCH_MAX_CHARS",
    "THREAD_SEARCH_MAX_MATCHES",
    "TOKENIZER_WORD_CACHE",
    "UPLOAD_LINGER_SECONDS",
    "UPLOAD_SESSION_WAIT_SECONDS",
    "USAGE_CACHE_ENTRIES",
    "USAGE_PENDING_ROWS",
    "USER_TABLE_ENTRIES",
)


# The sections in reading order, with their headings in docs/settings.md.
SECTIONS: tuple[Section, ...] = (
    Section("Engine", EngineSettings),
    Section("Chat", ChatSettings),
    Section("Presets", PresetSettings),
    Section("Documents", DocumentSettings),
    Section("Overload and fair share", AdmissionSettings),
    Section("OpenAI-compatible API", ApiSettings),
    Section("Sign-in", AccountSettings),
    Section("LDAP sign-in", LdapSettings),
    Section("Stored conversations", HistorySettings),
    Section("Usage and quotas", UsageSettings),
    Section("Audit log and admin page", AuditSettings),
    Section("Operations", ObservabilitySettings),
    Section("Requests and sizes", WebSettings),
    Section("Export, import and share links", TransferSettings),
    Section("Diagnostics", DiagnosticSettings),
)


# Sections are listed last-first: a dataclass orders inherited fields from the
# last base to the first.
@dataclass(frozen=True)
class Settings(
    DiagnosticSettings,
    AuditSettings,
    TransferSettings,
    WebSettings,
    ApiSettings,
    AdmissionSettings,
    LdapSettings,
    AccountSettings,
    UsageSettings,
    HistorySettings,
    ObservabilitySettings,
    DocumentSettings,
    PresetSettings,
    ChatSettings,
    EngineSettings,
):
    """All settings of the service. Field names are the env vars, lower-cased."""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Read and validate every setting; raise SettingsError naming the culprit."""
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = environ.get(f.metadata["env"])
            if raw is not None:
                values[f.name] = parse(f.metadata["env"], raw.strip(), f.type, f.metadata["min"])
        settings = cls(**values)
        settings.check()
        return settings

    def check(self) -> None:
        """Rules that tie settings together; raise SettingsError on the first broken one."""
        if self.max_new_tokens > self.max_new_tokens_limit:
            raise SettingsError(
                f"MAX_NEW_TOKENS={self.max_new_tokens} exceeds MAX_NEW_TOKENS_LIMIT="
                f"{self.max_new_tokens_limit}"
            )
        if self.max_new_tokens >= self.max_model_len:
            raise SettingsError(
                f"MAX_NEW_TOKENS={self.max_new_tokens} leaves no room for a prompt in "
                f"MAX_MODEL_LEN={self.max_model_len}"
            )
        if self.top_p > 1:
            raise SettingsError(f"TOP_P={self.top_p} must be at most 1")
        if self.frequency_penalty > 2:
            raise SettingsError(f"FREQUENCY_PENALTY={self.frequency_penalty} must be at most 2")
        self._check_models()
        for url in self.engine_url_list:
            if not url.startswith(("http://", "https://")):
                raise SettingsError(f"ENGINE_URLS entry {url!r} is not an http:// or https:// URL")
        if self.engine_router and len(self.engine_url_list) != 1:
            raise SettingsError("ENGINE_ROUTER=true needs ENGINE_URLS to name exactly one router URL")
        for name, allocator in (
            ("ENGINE_ALLOCATOR", self.engine_allocator),
            ("APP_ALLOCATOR", self.app_allocator),
        ):
            if allocator not in ENGINE_ALLOCATORS:
                raise SettingsError(f"{name}={allocator!r} is not one of {ENGINE_ALLOCATORS}")
        if self.diagnostics not in DIAGNOSTIC_LEVELS:
            levels = ", ".join(DIAGNOSTIC_LEVELS)
            raise SettingsError(f"DIAGNOSTICS={self.diagnostics!r} is not one of {levels}")
        self._check_sign_in()
        self._check_shared_limits()
        parse_origins("ALLOWED_ORIGINS", self.allowed_origins)  # raises on a bad one

    def _check_models(self) -> None:
        models = self.model_list
        if not models:
            return
        if self.model and not self.engine_url_list:
            raise SettingsError("MODELS replaces MODEL: set one of them")
        if len(models) > self.max_in_process_models and not self.engine_url_list:
            raise SettingsError(
                f"MODELS lists {len(models)} models; MAX_IN_PROCESS_MODELS={self.max_in_process_models} "
                "(each is a whole engine in this machine's memory)"
            )
        if len(models) > ENGINE_MODELS_MAX and self.engine_url_list:
            raise SettingsError(
                f"MODELS lists {len(models)} models; at most {ENGINE_MODELS_MAX} with ENGINE_URLS"
            )
        names = [Path(path.rstrip("/")).name for path in models]
        if len(set(names)) != len(names):
            raise SettingsError(f"MODELS: two models have the same folder name ({', '.join(names)})")

    def _check_sign_in(self) -> None:
        if self.auth_mode not in AUTH_MODES:
            raise SettingsError(f"AUTH_MODE={self.auth_mode!r} is not one of {', '.join(AUTH_MODES)}")
        if self.auth_mode == "header" and not (self.auth_header and self.auth_proxy_addresses):
            raise SettingsError("AUTH_MODE=header needs AUTH_HEADER and AUTH_PROXY_ADDRESSES")
        for name, spec in (
            ("AUTH_PROXY_ADDRESSES", self.auth_proxy_addresses),
            ("TRUSTED_PROXY_ADDRESSES", self.trusted_proxy_addresses),
        ):
            for part in filter(None, (part.strip() for part in spec.split(","))):
                try:
                    ipaddress.ip_network(part, strict=False)
                except ValueError as error:
                    raise SettingsError(f"{name}: {error}") from None
        if bool(self.admin_username) != bool(self.admin_password):
            raise SettingsError("ADMIN_USERNAME and ADMIN_PASSWORD are set together (or neither)")
        if self.database_url and not self.database_url.startswith(("postgresql", "postgres", "sqlite")):
            raise SettingsError("DATABASE_URL must start with postgresql:// (or sqlite:///path)")
        check_ldap(self, self.auth_mode)

    def _check_shared_limits(self) -> None:
        if self.shared_limits not in SHARED_LIMITS_MODES:
            modes = ", ".join(SHARED_LIMITS_MODES)
            raise SettingsError(f"SHARED_LIMITS={self.shared_limits!r} is not one of {modes}")
        if self.shared_limits == "on" and not is_postgres(self.database_url):
            raise SettingsError("SHARED_LIMITS=on needs DATABASE_URL to be PostgreSQL (replicas share it)")

    @property
    def limits_shared(self) -> bool:
        """Per-person limits and failed sign-ins are counted in the database (SHARED_LIMITS: `auto` or
        `on`, which validation only allows with PostgreSQL)."""
        return self.shared_limits != "off" and is_postgres(self.database_url)

    def non_default(self) -> dict[str, Any]:
        """Settings that differ from the defaults, secrets redacted (for the start-up log)."""
        changed = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value != f.default:
                env = f.metadata["env"]
                secret = env.endswith(SENSITIVE_SUFFIXES) or env in SENSITIVE_NAMES
                changed[env] = "***" if secret else value
        return changed

    @staticmethod
    def retired_in(environ: Mapping[str, str] | None = None) -> list[str]:
        """The RETIRED_SETTINGS that `environ` (the process's by default) still sets."""
        environ = os.environ if environ is None else environ
        return [name for name in RETIRED_SETTINGS if name in environ]

    def replace(self, **changes: Any) -> Settings:
        """A copy with some fields changed (tests and benchmarks)."""
        return dataclasses.replace(self, **changes)


if __name__ == "__main__":
    for path in write_generated(SECTIONS):
        print(f"wrote {path}")
