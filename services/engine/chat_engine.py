"""Chat on top of an engine backend: chat template, token budgets, streaming, aborts.

`ChatEngine.generate` guarantees that leaving a stream early (stop, task cancellation, disconnect,
exception) aborts the request inside the engine, so no KV cache outlives its reader. It works the
same over the in-process AsyncLLM and over vLLM servers (see backend.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
import uuid
import weakref
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from services.config import Settings
from services.engine.answer_tokens import ANSWER_TOKEN_CACHE_TOKENS, AnswerTokens
from services.engine.backends import LLMBackend
from services.engine.errors import EngineUnavailableError, TokenBudgetError
from services.engine.load import EngineLoad
from services.engine.loop_guard import LoopGuardConfig, RepetitionDetector
from services.engine.stream_stats import StreamStats
from services.memory import WordCacheBound

logger = logging.getLogger(__name__)

Message = dict[str, str]
# on_finish listeners are per component (metrics, tests), never per session or request:
# a longer list means someone registers in a loop, which would leak.
MAX_FINISH_CALLBACKS = 16
FinishCallback = Callable[[StreamStats], None]
# A summary ends at a horizontal rule: after one, the default model writes the summary again.
PROSE_STOP = ("\n---",)
DEFAULTS = Settings()  # what an engine built without the settings' parts keeps (tests, benchmarks)


@dataclass(frozen=True)
class SamplingSettings:
    """What a user may tune per session."""

    temperature: float
    top_p: float
    max_new_tokens: int
    repetition_penalty: float = 1.0  # vLLM's (HF-style: prompt and answer tokens)
    frequency_penalty: float = 0.0  # vLLM's (OpenAI-style: answer tokens, by count)
    min_new_tokens: int = 0  # vLLM's min_tokens: the answer may not end (or stop) sooner
    forbidden_phrases: tuple[str, ...] = ()  # vLLM's bad_words: the answer never spells one of them


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


class ChatEngine:
    """Chat on top of one engine backend: templating, budgets, streaming, aborts."""

    def __init__(
        self,
        llm: LLMBackend,
        max_model_len: int,
        *,
        load: EngineLoad | None = None,
        loop_guard: LoopGuardConfig | None = None,
        answer_tokens: AnswerTokens | None = None,
        word_caches: WordCacheBound | None = None,
        warm_up_report: Any = None,
    ) -> None:
        """The parts come from the settings (lifespan.py); without them, the settings' defaults.

        `load` is the engine's own numbers, fed by the backend; `answer_tokens` keeps the ids of
        recent answers, spliced back into the prompts that quote them (answer_tokens.py);
        `word_caches` bounds the tokenizer's (word_caches.py); `warm_up_report` is filled by the
        lifespan's warm-up (warmup.WarmUpReport).
        """
        self._llm = llm
        self.max_model_len = max_model_len
        self.tokenizer = llm.get_tokenizer()
        # Plain functions are held strongly, bound methods weakly (see on_finish).
        self._on_finish: list[FinishCallback | weakref.WeakMethod] = []
        self.last_output_at: float | None = None  # monotonic time of the engine's latest output
        self.load = load if load is not None else EngineLoad()
        self.warm_up_report = warm_up_report
        self._ping_prompt: list[int] | None = None
        self.loop_guard = loop_guard if loop_guard is not None else LoopGuardConfig()
        if answer_tokens is None:
            answer_tokens = AnswerTokens(ANSWER_TOKEN_CACHE_TOKENS, DEFAULTS.session_ttl_seconds)
        self.answer_tokens = answer_tokens
        self.word_caches = word_caches
        self.requests_finished_total = 0  # chat requests ended (any reason): memory per request

    @property
    def backend(self) -> LLMBackend:  # vLLM's AsyncLLM (or RemoteLLM): what the /v1 API serves from
        return self._llm

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
        self.requests_finished_total += 1
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
        return self.answer_tokens.splice(messages, list(ids), self._encode_text)

    def _encode_text(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def count_tokens(self, text: str) -> int:
        """Tokens of plain text (no template). A client's text may hold lone surrogates (JSON's
        `"\\ud800"`), which the tokenizer refuses with a TypeError: they count as U+FFFD."""
        valid = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
        return len(self.tokenizer.encode(valid, add_special_tokens=False))

    # --- requests ------------------------------------------------------------
    async def generate(
        self,
        messages: list[Message],
        sampling: SamplingSettings,
        request_id: str,
        *,
        priority: int = 0,
        prose: bool = False,
        answer_prefix: str = "",
    ) -> AsyncIterator[str]:
        """Stream the answer to `messages` as text deltas. The request is aborted in the engine on
        every early exit; the caller should close the iterator (``contextlib.aclosing``) when it stops early.
        `priority` goes to vLLM's scheduler (lower is earlier; services/admission picks it).
        `prose` is for summaries: the loop guard also stops paraphrased loops, and the answer ends at
        a "---" rule (a small model writes it again after one). `answer_prefix`: the answer's start.
        """
        if self._llm.errored:
            raise EngineUnavailableError("the engine is not running")
        prompt_ids = self.encode_chat(messages) + (self._encode_text(answer_prefix) if answer_prefix else [])
        max_tokens = token_budget(self.max_model_len, len(prompt_ids), sampling.max_new_tokens)
        params = _sampling_params(sampling, max_tokens, PROSE_STOP if prose else ())
        stats = StreamStats(request_id, prompt_tokens=len(prompt_ids), submitted_at=time.monotonic())
        loops = RepetitionDetector(self.loop_guard, self.tokenizer.decode, echoes=prose)
        answer_ids: list[int] = []
        answer: list[str] = []
        stream = self._llm.generate({"prompt_token_ids": prompt_ids}, params, request_id, priority=priority)
        try:
            async with contextlib.aclosing(stream):
                async for output in stream:
                    self.last_output_at = time.monotonic()
                    stats.observe(output, self.last_output_at)
                    completion = output.outputs[0]
                    loops.feed(completion.token_ids, completion.text)  # raises RepetitionError on a loop
                    answer_ids.extend(completion.token_ids)
                    if completion.text:
                        answer.append(completion.text)
                        yield completion.text
        finally:
            await self._finish(request_id, stats, loops, answer, answer_ids)

    async def _finish(
        self,
        request_id: str,
        stats: StreamStats,
        loops: RepetitionDetector,
        answer: list[str],
        answer_ids: list[int],
    ) -> None:
        """Abort a request left early, keep a whole answer's ids (quoted by the next turn), notify."""
        stats.finished_at = time.monotonic()
        if stats.finish_reason is None:
            stats.finish_reason = "repetition" if loops.fired else "abort"
            await self.abort(request_id)
        elif answer:
            self.answer_tokens.remember("".join(answer), answer_ids, self.tokenizer.decode)
        self._notify_finished(stats)

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
        started = time.monotonic()
        finished = False
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


def _sampling_params(sampling: SamplingSettings, max_tokens: int, stop: tuple[str, ...] = ()) -> Any:
    """vLLM SamplingParams that stream text deltas."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    return SamplingParams(
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        max_tokens=max_tokens,
        repetition_penalty=sampling.repetition_penalty,
        frequency_penalty=sampling.frequency_penalty,
        min_tokens=min(sampling.min_new_tokens, max_tokens),
        stop=list(stop) or None,
        bad_words=list(sampling.forbidden_phrases) or None,
        output_kind=RequestOutputKind.DELTA,
    )


def _merge_system_into_first_user(messages: list[Message]) -> list[Message]:
    system = messages[0]["content"]
    rest = list(messages[1:])
    for index, message in enumerate(rest):
        if message["role"] == "user":
            rest[index] = {"role": "user", "content": f"{system}\n\n{message['content']}"}
            break
    return rest
