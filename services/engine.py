"""The in-process vLLM engine: its life in one async context, chat streaming on top.

Everything that talks to vLLM lives here. `ChatEngine.generate` guarantees
that leaving a stream early (stop, task cancellation, disconnect, exception)
aborts the request inside the engine, so no KV cache outlives its reader.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import logging
import os
import re
import shutil
import tempfile
import time
import uuid
import weakref
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psutil

from services.config import Settings
from services.reaper import OrphanGuard

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM

logger = logging.getLogger(__name__)

Message = dict[str, str]
ENGINE_ARG_NAMES = (
    "model", "dtype", "max_model_len", "max_num_seqs", "max_num_batched_tokens",
    "enable_prefix_caching", "enable_chunked_prefill", "gpu_memory_utilization",
    "swap_space", "enforce_eager", "tensor_parallel_size", "quantization", "kv_cache_dtype",
)  # fmt: skip
# on_finish listeners are per component (metrics, tests), never per session or request:
# a longer list means someone registers in a loop, which would leak.
MAX_FINISH_CALLBACKS = 16
FinishCallback = Callable[["StreamStats"], None]


class TokenBudgetError(ValueError):
    """A prompt does not leave room for an answer in the context window."""


class EngineUnavailableError(RuntimeError):
    """The engine process died or never started; it cannot serve requests."""


@dataclass(frozen=True)
class SamplingSettings:
    """What a user may tune per session."""

    temperature: float
    top_p: float
    max_new_tokens: int


@dataclass
class StreamStats:
    """Timing of one request, filled in while it streams (read by metrics).

    Times are `time.monotonic()` seconds in the app process, except
    `queue_seconds`, which vLLM measures inside the engine core (from QUEUED
    to first SCHEDULED, as reported on `RequestOutput.metrics`).
    """

    request_id: str
    prompt_tokens: int = 0
    output_tokens: int = 0
    submitted_at: float = 0.0
    first_token_at: float | None = None
    last_token_at: float | None = None
    finished_at: float | None = None
    finish_reason: str | None = None
    queue_seconds: float | None = None

    @property
    def ttft_seconds(self) -> float | None:
        return None if self.first_token_at is None else self.first_token_at - self.submitted_at

    @property
    def inter_token_seconds(self) -> float | None:
        """Mean gap between output tokens as the app received them (needs two tokens)."""
        if self.first_token_at is None or self.last_token_at is None or self.output_tokens < 2:
            return None
        return (self.last_token_at - self.first_token_at) / (self.output_tokens - 1)

    @property
    def e2e_seconds(self) -> float | None:
        return None if self.finished_at is None else self.finished_at - self.submitted_at


def token_budget(max_model_len: int, prompt_tokens: int, max_new_tokens: int) -> int:
    """Answer tokens available for a prompt: the one budget rule of the service.

    Raises TokenBudgetError when the prompt leaves no room for even one token.
    """
    room = max_model_len - prompt_tokens
    if room < 1:
        raise TokenBudgetError(
            f"Input length ({prompt_tokens} tokens) exceeds the model's maximum "
            f"context length ({max_model_len} tokens)."
        )
    return min(max_new_tokens, room)


_ADDRESS = re.compile(r"0x[0-9a-fA-F]+")


def describe_failure(error: BaseException) -> str:
    """The one short, user-facing sentence for any failure of a turn."""
    if isinstance(error, TokenBudgetError):
        return f"Your message is too long for this model. {error}"
    if isinstance(error, EngineUnavailableError):
        return "The model is not available right now. Please try again in a moment."
    name = type(error).__name__
    if name == "EngineDeadError":
        return "The model stopped working. The operators have been alerted; please retry later."
    return "Something went wrong while generating the answer. Please try again."


def sanitize(text: str) -> str:
    """Strip memory addresses from an error text before it reaches a log or a user."""
    return _ADDRESS.sub("0x…", text)


def report_failure(error: BaseException, request_id: str | None) -> str:
    """Log a failed turn for the operator; return the sentence the user sees."""
    expected = isinstance(error, (TokenBudgetError, EngineUnavailableError))
    log = logger.warning if expected else logger.error
    log(
        "request %s failed: %s: %s",
        request_id,
        type(error).__name__,
        sanitize(str(error)),
        exc_info=None if expected else error,
    )
    return describe_failure(error)


class ChatEngine:
    """Chat on top of one AsyncLLM: templating, budgets, streaming, aborts."""

    def __init__(self, llm: AsyncLLM, max_model_len: int) -> None:
        self._llm = llm
        self.max_model_len = max_model_len
        self.tokenizer = llm.get_tokenizer()
        # Plain functions are held strongly, bound methods weakly (see on_finish).
        self._on_finish: list[FinishCallback | weakref.WeakMethod] = []
        self.last_output_at: float | None = None  # monotonic time of the engine's latest output
        self._ping_prompt: list[int] | None = None

    def on_finish(self, callback: FinishCallback) -> Callable[[], None]:
        """Register a function that receives every request's stats; return its unregister function.

        Bound methods are held weakly, so a listener dies with its owner even if
        nobody unregisters it. Registering the same callback twice keeps one.
        At most MAX_FINISH_CALLBACKS listeners: registering per request is a bug.
        """
        entry: FinishCallback | weakref.WeakMethod
        entry = weakref.WeakMethod(callback) if inspect.ismethod(callback) else callback
        self._prune_dead_callbacks()
        if entry not in self._on_finish:
            if len(self._on_finish) >= MAX_FINISH_CALLBACKS:
                raise RuntimeError(f"more than {MAX_FINISH_CALLBACKS} on_finish callbacks: a leak")
            self._on_finish.append(entry)

        def unregister() -> None:
            with contextlib.suppress(ValueError):
                self._on_finish.remove(entry)

        return unregister

    def _prune_dead_callbacks(self) -> None:
        self._on_finish[:] = [
            e for e in self._on_finish if not (isinstance(e, weakref.WeakMethod) and e() is None)
        ]

    def _notify_finished(self, stats: StreamStats) -> None:
        for entry in list(self._on_finish):
            callback = entry() if isinstance(entry, weakref.WeakMethod) else entry
            if callback is None:
                self._prune_dead_callbacks()
                continue
            try:
                callback(stats)
            except Exception:  # a broken listener must not break the user's stream
                logger.exception("on_finish callback %r failed", callback)

    # --- prompts -------------------------------------------------------------
    def encode_chat(self, messages: list[Message]) -> list[int]:
        """Token ids of `messages` under the model's chat template, ready to generate."""
        try:
            ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        except Exception as error:  # templates that reject a system role
            if not messages or messages[0]["role"] != "system" or "system" not in str(error).lower():
                raise
            merged = _merge_system_into_first_user(messages)
            ids = self.tokenizer.apply_chat_template(merged, add_generation_prompt=True, tokenize=True)
        if not isinstance(ids, list):  # transformers 5 may hand back a BatchEncoding
            ids = ids["input_ids"]
        return list(ids)

    def count_tokens(self, text: str) -> int:
        """Tokens of plain text (no template)."""
        return len(self.tokenizer.encode(text, add_special_tokens=False))

    # --- requests ------------------------------------------------------------
    async def generate(
        self, messages: list[Message], sampling: SamplingSettings, request_id: str
    ) -> AsyncIterator[str]:
        """Stream the answer to `messages` as text deltas.

        The request is aborted in the engine on every early exit; the caller
        should close the iterator (``contextlib.aclosing``) when it stops early.
        """
        if self._llm.errored:
            raise EngineUnavailableError("the engine is not running")
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        prompt_ids = self.encode_chat(messages)
        max_tokens = token_budget(self.max_model_len, len(prompt_ids), sampling.max_new_tokens)
        params = SamplingParams(
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            max_tokens=max_tokens,
            output_kind=RequestOutputKind.DELTA,
        )
        stats = StreamStats(request_id, prompt_tokens=len(prompt_ids), submitted_at=time.monotonic())
        stream = self._llm.generate({"prompt_token_ids": prompt_ids}, params, request_id)
        try:
            async with contextlib.aclosing(stream):
                async for output in stream:
                    now = self.last_output_at = time.monotonic()
                    completion = output.outputs[0]
                    stats.output_tokens += len(completion.token_ids)
                    if completion.token_ids:
                        stats.last_token_at = now
                        if stats.first_token_at is None:
                            stats.first_token_at = now
                    if stats.queue_seconds is None:
                        stats.queue_seconds = _queue_seconds(output)
                    if output.finished:
                        stats.finish_reason = completion.finish_reason or "stop"
                    if completion.text:
                        yield completion.text
        finally:
            stats.finished_at = time.monotonic()
            if stats.finish_reason is None:
                stats.finish_reason = "abort"
                await self.abort(request_id)
            self._notify_finished(stats)

    async def warm_up(self) -> None:
        """One short request, so the first user does not pay for lazy initialisation."""
        messages = [{"role": "user", "content": "Hello"}]
        async for _ in self.generate(messages, SamplingSettings(0.0, 1.0, 4), "warm-up"):
            pass

    async def ping(self, timeout_seconds: float) -> float:
        """Generate one token for a one-word prompt; return the seconds it took.

        For health checks: it bypasses the on_finish listeners (so request
        metrics count only chat requests) and aborts its request on timeout.
        """
        if self._llm.errored:
            raise EngineUnavailableError("the engine is not running")
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        if self._ping_prompt is None:
            self._ping_prompt = self.encode_chat([{"role": "user", "content": "ping"}])
        params = SamplingParams(temperature=0.0, max_tokens=1, output_kind=RequestOutputKind.FINAL_ONLY)
        request_id = f"healthz-{uuid.uuid4().hex[:12]}"
        started, finished = time.monotonic(), False
        stream = self._llm.generate({"prompt_token_ids": self._ping_prompt}, params, request_id)
        try:
            async with asyncio.timeout(timeout_seconds), contextlib.aclosing(stream):
                async for output in stream:
                    finished = output.finished
        finally:
            if not finished:
                await self.abort(request_id)
        self.last_output_at = time.monotonic()
        return self.last_output_at - started

    async def abort(self, request_id: str) -> None:
        """Abort a request; unknown or finished ids are ignored."""
        with contextlib.suppress(Exception):
            await self._llm.abort(request_id)

    def unfinished_requests(self) -> int:
        """Requests the engine still holds (0 when idle and nothing leaked)."""
        return self._llm.get_num_unfinished_requests()

    @property
    def alive(self) -> bool:
        return not self._llm.errored

    async def check_health(self) -> None:
        """Raise if the engine core process is dead."""
        await self._llm.check_health()

    def shutdown(self) -> None:
        self._llm.shutdown()


def _queue_seconds(output: Any) -> float | None:
    """Engine-side queue time of a request, from vLLM's per-request stats (None when stats are off)."""
    metrics = getattr(output, "metrics", None)
    queued = getattr(metrics, "queued_ts", 0.0)
    scheduled = getattr(metrics, "scheduled_ts", 0.0)
    if not queued or not scheduled:
        return None
    return max(0.0, scheduled - queued)


def _merge_system_into_first_user(messages: list[Message]) -> list[Message]:
    system, rest = messages[0]["content"], list(messages[1:])
    for index, message in enumerate(rest):
        if message["role"] == "user":
            rest[index] = {"role": "user", "content": f"{system}\n\n{message['content']}"}
            break
    return rest


def engine_args(settings: Settings) -> Any:
    """vLLM AsyncEngineArgs from the settings, keeping only fields this vLLM knows."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    known = {f.name for f in dataclasses.fields(AsyncEngineArgs)}
    kwargs: dict[str, Any] = {}
    for name in ENGINE_ARG_NAMES:
        value = settings.model_path if name == "model" else getattr(settings, name)
        if name == "quantization" and not value:
            value = None
        if name == "dtype" and value == "auto":
            value = auto_dtype()
        if name not in known:
            default = next(f.default for f in dataclasses.fields(Settings) if f.name == name)
            if value != default:
                logger.warning("%s is not an engine option of this vLLM version; ignored", name.upper())
            continue
        kwargs[name] = value
    return AsyncEngineArgs(**kwargs)


def auto_dtype() -> str:
    """bfloat16 where the hardware computes it natively (CUDA, AVX512-BF16/AMX CPUs), else float32.

    On an AVX2-only CPU bf16 is emulated: a ~740-token prompt took 89 s in bf16
    against 7 s in float32 here, and 8-stream decoding ran 3x slower.
    """
    import torch

    if torch.cuda.is_available():
        return "auto"  # the model's own dtype (bf16 for most current models)
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            flags = set(cpuinfo.read().split())
    except OSError:
        flags = set()
    return "bfloat16" if flags & {"avx512_bf16", "amx_bf16"} else "float32"


def prepare_process_env(settings: Settings, rpc_dir: str) -> None:
    """Environment vLLM reads when it starts its processes (see FIELD_NOTES)."""
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(settings.cpu_kvcache_space_gib)
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "auto")
    # ZMQ socket files go to a private folder we remove on shutdown.
    os.environ["VLLM_RPC_BASE_PATH"] = rpc_dir
    # vLLM spawns its processes, so their glibc reads this at start (the app's own is unaffected).
    if settings.engine_mmap_threshold_bytes:
        os.environ["MALLOC_MMAP_THRESHOLD_"] = str(settings.engine_mmap_threshold_bytes)
    # Read by the oneDNN inside vLLM's CPU kernels when its cache is first used (in the worker).
    os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] = str(settings.engine_onednn_cache_capacity)


async def prepare_default_model(settings: Settings) -> None:
    """Turn the bundled GGUF into a model folder once, when MODEL is not set."""
    if not settings.model:
        from services.model_prep import ensure_default_model

        await asyncio.to_thread(ensure_default_model, settings)


@contextlib.asynccontextmanager
async def engine_lifespan(settings: Settings) -> AsyncIterator[ChatEngine]:
    """Create the engine (in-process, or vLLM servers when ENGINE_URLS is set), yield it, close it."""
    lifespan = remote_engine_lifespan if settings.engine_url_list else local_engine_lifespan
    async with lifespan(settings) as engine:
        yield engine


@contextlib.asynccontextmanager
async def remote_engine_lifespan(settings: Settings) -> AsyncIterator[ChatEngine]:
    """Chat through the vLLM servers of ENGINE_URLS; nothing to start here but a connection pool."""
    from vllm.tokenizers import get_tokenizer

    from services.remote import RemoteLLM

    await prepare_default_model(settings)

    tokenizer = await asyncio.to_thread(get_tokenizer, settings.model_path)
    remote = RemoteLLM(
        settings.engine_url_list,
        tokenizer,
        connect_timeout=settings.engine_connect_timeout_seconds,
        idle_timeout=settings.engine_stream_timeout_seconds,
        max_connections=settings.engine_max_connections,
    )
    try:
        await remote.connect()
        engine = ChatEngine(remote, remote.max_model_len)  # type: ignore[arg-type]
        await engine.warm_up()
        yield engine
    finally:
        await remote.aclose()


@contextlib.asynccontextmanager
async def local_engine_lifespan(settings: Settings) -> AsyncIterator[ChatEngine]:
    """Start vLLM's AsyncLLM in this process tree, yield it, and shut it down on every exit path."""
    rpc_dir = tempfile.mkdtemp(prefix="vllm-chat-rpc-")
    llm = guard = None
    try:
        prepare_process_env(settings, rpc_dir)
        await prepare_default_model(settings)
        from vllm.v1.engine.async_llm import AsyncLLM

        started = time.monotonic()
        llm = AsyncLLM.from_engine_args(engine_args(settings))
        guard = OrphanGuard(engine_processes())
        engine = ChatEngine(llm, llm.model_config.max_model_len)
        await engine.warm_up()
        logger.info("engine ready in %.1f s (model %s)", time.monotonic() - started, settings.model_path)
        yield engine
    finally:
        children = engine_processes()
        if llm is not None:
            llm.shutdown()
        _reap(children)
        if guard is not None:
            guard.close()
        shutil.rmtree(rpc_dir, ignore_errors=True)


def engine_processes() -> list[psutil.Process]:
    """vLLM's processes under this one (EngineCore, workers: they set their titles to VLLM::...)."""
    found = []
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if "VLLM" in child.name() or any("VLLM::" in part for part in child.cmdline()[:1]):
                found.append(child)
    return found


def _reap(processes: list[psutil.Process], grace_seconds: float = 5.0) -> None:
    """Kill engine processes that outlived shutdown.

    When EngineCore dies (e.g. a step passes vLLM's execute timeout), its worker
    is re-parented to init and keeps computing; nothing else would stop it.
    """
    _, alive = psutil.wait_procs(processes, timeout=grace_seconds)
    for process in alive:
        with contextlib.suppress(psutil.Error):
            logger.warning("killing engine process %s (%s) left after shutdown", process.pid, process.name())
            process.kill()
