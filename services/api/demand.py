"""What a /v1 request would use at most (admission's `Demand`, services/admission/grants.py), read as
vLLM's request models read it, and its body with shorter answers when admission cut it to fit.

Sequences are `n` choices of each prompt (checks.py); each may write its answer limit: for chat
`max_completion_tokens`, else `max_tokens`, else whatever the context leaves after the prompt; for
completions `max_tokens`, else vLLM's default (16). The prompt is counted as the usage meter counts
it (usage.py): token ids as given, texts by the tokenizer. What the gate cannot see (a chat
template's own tokens, special tokens) is not counted, so a person's usage can pass a budget by at
most that much.

A cut sets the answer limit vLLM reads first (`max_completion_tokens` for chat, `max_tokens` for
completions) and lowers `min_tokens` to it, which vLLM requires to be no larger.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from services.admission.grants import Demand
from services.api.checks import as_vllm_reads, choice_count, prompt_count, request_model
from services.api.usage import prompt_parts

CHAT_PATH = "/v1/chat/completions"


def answer_field(path: str) -> str:
    """The body field vLLM reads first for the answer limit on `path`."""
    return "max_completion_tokens" if path == CHAT_PATH else "max_tokens"


def asked_answer_tokens(path: str, request: dict[str, Any], room_in_context: int) -> int:
    """The answer tokens each sequence may write, as vLLM reads the request: at least 1 (vLLM's own
    least, with `echo` and none asked), `room_in_context` when a chat request sets no limit."""
    fields = ("max_completion_tokens", "max_tokens") if path == CHAT_PATH else ("max_tokens",)
    for name in fields:
        value = as_vllm_reads(path, name, request.get(name))
        if isinstance(value, int):
            return max(1, value)
    if path == CHAT_PATH:
        return max(1, room_in_context)
    return max(1, request_model(path).model_fields["max_tokens"].default)  # vLLM reads null as its default


def request_demand(
    path: str, request: dict[str, Any], count_tokens: Callable[[str], int], context_tokens: int
) -> Demand:
    """The most `request` on `path` would use, its prompt counted with `count_tokens` and a chat
    answer without a limit given what `context_tokens` leaves."""
    texts, ids = prompt_parts(request)
    prompt = ids + (count_tokens("\n".join(texts)) if texts else 0)
    sequences = choice_count(path, request) * prompt_count(path, request)
    return Demand(prompt, asked_answer_tokens(path, request, context_tokens - prompt), sequences)


def with_answer_limit(path: str, request: dict[str, Any], answer_tokens: int) -> dict[str, Any]:
    """`request` with at most `answer_tokens` per sequence (and `min_tokens` no larger)."""
    body = {**request, answer_field(path): answer_tokens}
    least = as_vllm_reads(path, "min_tokens", request.get("min_tokens"))
    if isinstance(least, int) and least > answer_tokens:
        body["min_tokens"] = answer_tokens
    return body
