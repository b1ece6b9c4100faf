"""The one settings object: every limit and engine option, read from env vars.

Engine options carry the names of vLLM's ``AsyncEngineArgs`` fields (upper-cased
as env vars), so vLLM's own documentation explains them. Values are parsed and
validated once, at startup, and a bad value stops the app with a message that
names the variable, the value and what was expected.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
SENSITIVE_SUFFIXES = ("_TOKEN", "_SECRET", "PASSWORD", "_KEY")


class SettingsError(ValueError):
    """A setting has a value the app cannot use."""


def _setting(default: Any, env: str, doc: str, minimum: float | None = None) -> Any:
    return field(default=default, metadata={"env": env, "doc": doc, "min": minimum})


def _default_cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return str(Path(base) / "vllm-chat")


@dataclass(frozen=True)
class Settings:
    """All settings of the service. Field names are the env vars, lower-cased."""

    # --- engine: names as in vLLM's AsyncEngineArgs --------------------------
    model: str = _setting(
        "", "MODEL", "Model folder or id vLLM loads; empty = bundled SmolLM2-135M-Instruct."
    )
    dtype: str = _setting(
        "auto",
        "DTYPE",
        "Weights/activations dtype; auto = bfloat16 on GPUs and bf16-capable CPUs, else float32.",
    )
    max_model_len: int = _setting(8192, "MAX_MODEL_LEN", "Context window in tokens (prompt + answer).", 16)
    max_num_seqs: int = _setting(64, "MAX_NUM_SEQS", "Sequences batched together at most.", 1)
    max_num_batched_tokens: int = _setting(
        2048,
        "MAX_NUM_BATCHED_TOKENS",
        "Tokens per engine step: long prompts are prefilled in pieces this size, so other "
        "streams keep flowing while a document is read (prefill runs ~500 tokens/s on 2 cores).",
        16,
    )
    enable_prefix_caching: bool = _setting(
        True, "ENABLE_PREFIX_CACHING", "Reuse KV of shared prompt prefixes (history, documents)."
    )
    enable_chunked_prefill: bool = _setting(
        True, "ENABLE_CHUNKED_PREFILL", "Split long prompts so decoding streams keep flowing."
    )
    gpu_memory_utilization: float = _setting(
        0.9, "GPU_MEMORY_UTILIZATION", "Share of GPU memory vLLM may use (CUDA only).", 0.01
    )
    swap_space: float = _setting(4.0, "SWAP_SPACE", "CPU swap space per GPU in GiB (CUDA only).", 0)
    enforce_eager: bool = _setting(
        True, "ENFORCE_EAGER", "Skip torch.compile/graphs: starts in ~25 s instead of minutes."
    )
    tensor_parallel_size: int = _setting(1, "TENSOR_PARALLEL_SIZE", "GPUs per model replica.", 1)
    quantization: str = _setting(
        "", "QUANTIZATION", "Quantization method (awq, gptq, fp8, ...); empty = none."
    )
    kv_cache_dtype: str = _setting("auto", "KV_CACHE_DTYPE", "KV cache dtype (auto, fp8, ...).")
    cpu_kvcache_space_gib: int = _setting(
        1, "VLLM_CPU_KVCACHE_SPACE", "KV-cache size in GiB on CPU (vLLM's own variable).", 1
    )
    engine_mmap_threshold_bytes: int = _setting(
        128 * 1024,
        "ENGINE_MMAP_THRESHOLD_BYTES",
        "glibc MALLOC_MMAP_THRESHOLD_ of the vLLM processes: blocks this size and up are "
        "mmapped and returned to the OS when freed. glibc's own threshold drifts up to 32 MB, "
        "after which tensors of varying length pile up in a heap that never shrinks. "
        "0 = glibc's drifting default.",
        0,
    )
    engine_onednn_cache_capacity: int = _setting(
        16,
        "ENGINE_ONEDNN_CACHE_CAPACITY",
        "oneDNN's global primitive cache (ONEDNN_PRIMITIVE_CACHE_CAPACITY) in vLLM's CPU "
        "processes. Each new batch size compiles 4 matmul primitives (~1.2 MB with the default "
        "model); oneDNN's default keeps 1024 (~300 MB), filled slowly as traffic brings new sizes. "
        "vLLM keeps its own 32 sizes per layer shape in front of it. 1024 = oneDNN's default.",
        0,
    )
    # --- remote engine: vLLM servers instead of the in-process engine -----------
    engine_urls: str = _setting(
        "",
        "ENGINE_URLS",
        "Comma-separated base URLs of `vllm serve` servers (e.g. http://10.0.0.5:8000); empty = the "
        "in-process engine. All must serve one model; MODEL then names its tokenizer (a folder or a "
        "cached id), and the context window and engine options are the servers' own. Each request "
        "goes to the healthy server with the fewest of ours in flight; a server that refuses the "
        "connection is skipped.",
    )
    engine_connect_timeout_seconds: float = _setting(
        10.0, "ENGINE_CONNECT_TIMEOUT_SECONDS", "Seconds to open a connection to a vLLM server.", 0.1
    )
    engine_max_connections: int = _setting(
        256,
        "ENGINE_MAX_CONNECTIONS",
        "Open streams to the vLLM servers at most (one per request in flight); more requests wait.",
        1,
    )
    engine_stream_timeout_seconds: float = _setting(
        600.0,
        "ENGINE_STREAM_TIMEOUT_SECONDS",
        "Seconds a vLLM server's stream may stay silent (a long prompt queued behind others) before "
        "the turn fails.",
        1,
    )

    # --- chat ----------------------------------------------------------------
    system_prompt: str = _setting(
        "You are a helpful, concise assistant.", "SYSTEM_PROMPT", "Default system prompt."
    )
    temperature: float = _setting(0.2, "TEMPERATURE", "Default sampling temperature.", 0)
    top_p: float = _setting(0.9, "TOP_P", "Default nucleus sampling top_p.", 0.01)
    max_new_tokens: int = _setting(512, "MAX_NEW_TOKENS", "Default answer budget in tokens.", 1)
    max_new_tokens_limit: int = _setting(
        4096, "MAX_NEW_TOKENS_LIMIT", "Largest answer budget a user may pick in chat settings.", 1
    )
    max_message_chars: int = _setting(
        100_000, "MAX_MESSAGE_CHARS", "Longest chat message accepted, in characters.", 1
    )
    max_history_messages: int = _setting(
        200, "MAX_HISTORY_MESSAGES", "Messages kept per session before the oldest are dropped.", 2
    )

    # --- sessions ------------------------------------------------------------
    max_sessions: int = _setting(
        1000, "MAX_SESSIONS", "Sessions kept at once; the least recently used is evicted.", 1
    )
    session_ttl_seconds: float = _setting(
        3600.0, "SESSION_TTL_SECONDS", "Idle time after which a session is dropped.", 1
    )

    # --- documents -----------------------------------------------------------
    max_upload_bytes: int = _setting(
        20 * 1024 * 1024, "MAX_UPLOAD_BYTES", "Largest upload accepted (checked before it is read).", 1
    )
    upload_linger_seconds: float = _setting(
        5.0,
        "UPLOAD_LINGER_SECONDS",
        "After refusing an upload, how long its unread rest is read and discarded, so the "
        "client sees the refusal instead of a connection reset.",
        0,
    )
    max_files_per_message: int = _setting(5, "MAX_FILES_PER_MESSAGE", "Files read from one message.", 1)
    max_document_pages: int = _setting(500, "MAX_DOCUMENT_PAGES", "PDF pages read at most.", 1)
    max_document_chars: int = _setting(
        1_000_000, "MAX_DOCUMENT_CHARS", "Characters of text kept from one document.", 1
    )
    max_document_tokens: int = _setting(
        200_000, "MAX_DOCUMENT_TOKENS", "Documents longer than this are cut (and the user told).", 1
    )
    max_docx_uncompressed_bytes: int = _setting(
        100 * 1024 * 1024, "MAX_DOCX_UNCOMPRESSED_BYTES", "Unpacked size a .docx may have (zip bombs).", 1
    )
    summary_concurrency: int = _setting(
        8, "SUMMARY_CONCURRENCY", "Chunk summaries in flight at once per document (map step).", 1
    )
    summary_max_tokens: int = _setting(400, "SUMMARY_MAX_TOKENS", "Length budget of a summary.", 16)
    summary_chunk_tokens: int = _setting(
        2048, "SUMMARY_CHUNK_TOKENS", "Chunk size of the map step (smaller = more parallel).", 64
    )
    summary_cache_entries: int = _setting(256, "SUMMARY_CACHE_ENTRIES", "Summaries cached at most.", 1)
    summary_cache_bytes: int = _setting(
        8 * 1024 * 1024, "SUMMARY_CACHE_BYTES", "Total size of cached summaries.", 1
    )
    summary_cache_ttl_seconds: float = _setting(
        86_400.0, "SUMMARY_CACHE_TTL_SECONDS", "How long a cached summary is reused.", 1
    )
    retrieval_top_k: int = _setting(
        4, "RETRIEVAL_TOP_K", "Chunks quoted for a question when the document does not fit.", 1
    )

    # --- maintenance and memory ------------------------------------------------
    maintenance_interval_seconds: float = _setting(
        30.0, "MAINTENANCE_INTERVAL_SECONDS", "Seconds between maintenance rounds (expire, gc, trim).", 1
    )
    memory_sample_seconds: float = _setting(
        5.0, "MEMORY_SAMPLE_SECONDS", "Seconds between memory samples of the process tree.", 0.5
    )
    memory_samples_kept: int = _setting(
        4320, "MEMORY_SAMPLES_KEPT", "Memory samples kept in the ring buffer (6 h at 5 s).", 10
    )
    leak_warmup_seconds: float = _setting(
        300.0, "LEAK_WARMUP_SECONDS", "Start-up period left out of the leak slope.", 0
    )
    leak_window_seconds: float = _setting(
        3600.0, "LEAK_WINDOW_SECONDS", "Sliding window of the leak slope.", 60
    )
    leak_alarm_mb_per_hour: float = _setting(
        10.0, "LEAK_ALARM_MB_PER_HOUR", "Whole-tree memory growth that raises the leak alarm.", 0
    )
    latency_samples_kept: int = _setting(
        10_000, "LATENCY_SAMPLES_KEPT", "Recent requests kept for /stats percentiles and plots.", 10
    )

    # --- files and processes -------------------------------------------------
    cache_dir: str = _setting(_default_cache_dir(), "CACHE_DIR", "Where the prepared default model is kept.")
    ops_token: str = _setting(
        "",
        "OPS_TOKEN",
        "When set, GET /status, /metrics and /stats need `Authorization: Bearer <token>`; /healthz "
        "stays open for load balancers. Empty = open (fine on a private network only).",
    )
    health_recent_output_seconds: float = _setting(
        30.0,
        "HEALTH_RECENT_OUTPUT_SECONDS",
        "/healthz counts an engine that produced output this recently as answering, without a ping.",
        0,
    )
    health_ping_timeout_seconds: float = _setting(
        15.0, "HEALTH_PING_TIMEOUT_SECONDS", "/healthz answers 503 when a one-token ping takes longer.", 0.1
    )

    @property
    def engine_url_list(self) -> list[str]:
        """ENGINE_URLS as a list (empty: the in-process engine)."""
        return [url.strip() for url in self.engine_urls.split(",") if url.strip()]

    @property
    def model_path(self) -> str:
        """What vLLM loads: MODEL, or the prepared default model's folder."""
        return self.model or str(Path(self.cache_dir) / "models" / DEFAULT_MODEL_NAME)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Read and validate every setting; raise SettingsError naming the culprit."""
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in fields(cls):
            env = f.metadata["env"]
            raw = environ.get(env)
            if raw is None:
                continue
            values[f.name] = _parse(env, raw.strip(), f.type, f.metadata["min"])
        settings = cls(**values)
        settings._check()
        return settings

    def _check(self) -> None:
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
        for url in self.engine_url_list:
            if not url.startswith(("http://", "https://")):
                raise SettingsError(f"ENGINE_URLS entry {url!r} is not an http:// or https:// URL")

    def non_default(self) -> dict[str, Any]:
        """Settings that differ from the defaults, secrets redacted (for the start-up log)."""
        changed = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value != f.default:
                env = f.metadata["env"]
                redact = env.endswith(SENSITIVE_SUFFIXES)
                changed[env] = "***" if redact else value
        return changed

    def replace(self, **changes: Any) -> Settings:
        """A copy with some fields changed (tests and benchmarks)."""
        return dataclasses.replace(self, **changes)


def _parse(env: str, raw: str, kind: str, minimum: float | None) -> Any:
    """Parse one env value by the field's declared type name."""
    if kind == "str":
        return raw
    if kind == "bool":
        lowered = raw.lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off"):
            return False
        raise SettingsError(f"{env}={raw!r} is not a boolean (use true or false)")
    try:
        value: float = int(raw) if kind == "int" else float(raw)
    except ValueError:
        expected = "a whole number" if kind == "int" else "a number"
        raise SettingsError(f"{env}={raw!r} is not {expected}") from None
    if minimum is not None and value < minimum:
        raise SettingsError(f"{env}={raw!r} must be at least {minimum:g}")
    return value


def settings_table() -> str:
    """The README's settings table, generated from the fields (one source of truth)."""
    rows = ["| Variable | Default | Meaning |", "|---|---|---|"]
    for f in fields(Settings):
        default = f.default
        if f.name == "cache_dir":
            default = "~/.cache/vllm-chat"
        shown = f"`{default}`" if default != "" else "(empty)"
        rows.append(f"| `{f.metadata['env']}` | {shown} | {f.metadata['doc']} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(settings_table())
