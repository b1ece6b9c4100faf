"""The model engine and chat on top of it: one `ChatEngine` over vLLM in this process or vLLM servers.

- `engine_lifespan(settings)`: the engine's whole life in one async context (the
  backend for the settings, the loop guard, the answer-token cache, the word-cache
  bound, the warm-up), yielding a `ChatEngine`;
- `ChatEngine`: chat template, token budgets, streaming, and an abort on every
  early exit; `SamplingSettings`, `Message`, `token_budget`;
- what a turn may fail with and how it is told (`report_failure`, the errors);
- the engine's own numbers (`EngineLoad`), one request's timing (`StreamStats`),
  the prefill meter, the loop guard and the warm-up report.

The two backends live in `backends/` (`local`: vLLM's AsyncLLM in this process
tree; `remote`: vLLM servers). Names are imported on first use, so a process that
needs one module (the orphan guard, `backends/local/processes.py`) loads only that.
"""

from __future__ import annotations

from services import lazy_exports

# Each name outside code uses -> "module:attribute" inside this package.
_EXPORTS = {
    "AnswerTokens": "answer_tokens:AnswerTokens",
    "ChatEngine": "chat_engine:ChatEngine",
    "Message": "chat_engine:Message",
    "PROSE_STOP": "chat_engine:PROSE_STOP",
    "SamplingSettings": "chat_engine:SamplingSettings",
    "token_budget": "chat_engine:token_budget",
    "EchoError": "errors:EchoError",
    "EngineBusyError": "errors:EngineBusyError",
    "EngineUnavailableError": "errors:EngineUnavailableError",
    "REPETITION_STOPPED": "errors:REPETITION_STOPPED",
    "RepetitionError": "errors:RepetitionError",
    "TokenBudgetError": "errors:TokenBudgetError",
    "describe_failure": "errors:describe_failure",
    "is_engine_busy": "errors:is_engine_busy",
    "report_failure": "errors:report_failure",
    "sanitize": "errors:sanitize",
    "engine_lifespan": "lifespan:engine_lifespan",
    "EngineLoad": "load:EngineLoad",
    "ServedModels": "served:ServedModels",
    "UnavailableModelError": "served:UnavailableModelError",
    "UnknownModelError": "served:UnknownModelError",
    "model_names": "models:model_names",
    "served_models_lifespan": "models:served_models_lifespan",
    "LoadWindow": "load:LoadWindow",
    "EchoDetector": "loop_guard:EchoDetector",
    "LoopGuardConfig": "loop_guard:LoopGuardConfig",
    "RepetitionDetector": "loop_guard:RepetitionDetector",
    "repeats_in": "loop_guard:repeats_in",
    "PrefillMeter": "prefill:PrefillMeter",
    "tick_until_first": "prefill:tick_until_first",
    "Rewrite": "rewrite:Rewrite",
    "followed_by": "rewrite:followed_by",
    "StreamStats": "stream_stats:StreamStats",
    "WarmUpReport": "warmup:WarmUpReport",
    "warm_up": "warmup:warm_up",
}
__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
