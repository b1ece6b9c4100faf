"""The wire format of vLLM's /v1/completions stream, and what its failures are called here."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from services.engine.errors import EngineUnavailableError


class RemoteEngineError(RuntimeError):
    """A vLLM server refused or failed a request."""


class ServerUnreachableError(EngineUnavailableError):
    """No vLLM server could be reached (users see "the model is not available")."""


@dataclass
class Completion:
    """One streamed delta, shaped like vLLM's `CompletionOutput` where ChatEngine reads it."""

    text: str
    token_ids: list[int]
    finish_reason: str | None


@dataclass
class Output:
    """One streamed chunk, shaped like vLLM's `RequestOutput` where ChatEngine reads it."""

    outputs: list[Completion]
    finished: bool
    metrics: None = None  # queue time is measured inside the server, not reported over HTTP


def parse_event(line: str) -> dict[str, Any] | None:
    """The JSON of one server-sent-events `data:` line; None for other lines and `[DONE]`."""
    if not line.startswith("data:"):
        return None
    payload = line[len("data:") :].strip()
    if not payload or payload == "[DONE]":
        return None
    return json.loads(payload)


def completion_body(
    model: str, prompt_ids: list[int], params: Any, priority: int | None = None
) -> dict[str, Any]:
    """The /v1/completions body for a SamplingParams: token ids in, text and token ids out."""
    body = {
        "model": model,
        "prompt": prompt_ids,
        "max_tokens": params.max_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "frequency_penalty": getattr(params, "frequency_penalty", 0.0),
        "repetition_penalty": getattr(params, "repetition_penalty", 1.0),  # vLLM's extension of the API
        "min_tokens": getattr(params, "min_tokens", 0),  # vLLM's extension of the API
        "stream": True,
        "return_token_ids": True,
    }
    if getattr(params, "stop", None):
        body["stop"] = list(params.stop)
    if getattr(params, "bad_words", None):
        body["bad_words"] = list(params.bad_words)  # vLLM's extension of the API
    if priority is not None:
        body["priority"] = priority
    return body


def chunk_output(event: dict[str, Any]) -> Output:
    """An Output from one streamed completion chunk; an error event raises."""
    if "error" in event or not event.get("choices"):
        detail = event.get("error") or event
        message = detail.get("message", detail) if isinstance(detail, dict) else detail
        raise RemoteEngineError(f"the vLLM server failed the request: {message}")
    choice = event["choices"][0]
    finish_reason = choice.get("finish_reason")
    token_ids = list(choice.get("token_ids") or [])
    completion = Completion(choice.get("text") or "", token_ids, finish_reason)
    return Output([completion], finished=finish_reason is not None)
