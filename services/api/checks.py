"""What the gate checks in a request body before vLLM sees it: JSON, known parameters, sizes, `n`.

A body nested deeper than MAX_JSON_DEPTH is refused before it is parsed for real: Python's parser
raises RecursionError at ~1,000 levels (a 500 and a traceback), and vLLM parses the body again.

vLLM's own layer answers an unknown model, `max_tokens` past the context and wrong types in OpenAI's
error shape; it only logs parameters it does not know, and it serves `n` > 1, lists of prompts and
any number of messages. These checks close those gaps, each with its own clear message. A number is
read as vLLM's request model will read it (pydantic's lax mode: `"8"`, `8.0` and `"8.0"` are all 8),
never by its JSON type, and every sequence a request would run (`n` choices of each prompt) counts.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from functools import cache
from typing import Annotated, Any

from pydantic import TypeAdapter, ValidationError

from services.api.errors import ApiError
from services.config import Settings

SET_BY_SERVICE = ("priority",)  # vLLM parameters a caller may not choose: the service ranks requests
# Deepest nesting of a JSON request body (the API's, Chainlit's routes') or socket message: deeper ones are
# refused before they are parsed for real.
MAX_JSON_DEPTH = 64


def request_model(path: str) -> Any:
    """vLLM's request model for `path`."""
    if path == "/v1/chat/completions":
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest as Model
    else:
        from vllm.entrypoints.openai.completion.protocol import CompletionRequest as Model  # type: ignore[assignment]
    return Model


@cache
def known_parameters(path: str) -> frozenset[str]:
    """The body fields vLLM's request model for `path` declares (names and aliases)."""
    Model = request_model(path)
    names = set(Model.model_fields)
    names |= {field.alias for field in Model.model_fields.values() if field.alias}
    return frozenset(names - set(SET_BY_SERVICE))


class JsonTooDeep(ValueError):
    """A JSON document nested deeper than allowed."""


def parse_json(body: bytes | str, max_depth: int, loads: Callable[[Any], Any] = json.loads) -> Any:
    """The JSON document in `body` (parsed by `loads`); raises JsonTooDeep past `max_depth` levels of
    arrays and objects, ValueError when it is not JSON."""
    try:
        document = loads(body)
    except RecursionError:
        raise JsonTooDeep(f"nested deeper than {max_depth} levels") from None
    pending: list[tuple[Any, int]] = [(document, 1)] if isinstance(document, (dict, list)) else []
    while pending:  # by hand, not recursively: the document may be close to the recursion limit
        value, depth = pending.pop()
        if depth > max_depth:
            raise JsonTooDeep(f"nested deeper than {max_depth} levels")
        children = value.values() if isinstance(value, dict) else value
        pending.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return document


INT64 = (-(2**63), 2**63 - 1)  # what vLLM's engine can carry (msgpack): seeds, token ids, counts


def number_problem(document: Any) -> str | None:
    """Why a parsed body holds a number no request may carry: an integer past 64 bits (vLLM cannot
    serialize it: a 500), or NaN / Infinity (Python's parser accepts them; JSON has no such thing)."""
    pending = [document]
    while pending:
        value = pending.pop()
        if isinstance(value, dict):
            pending.extend(value.values())
        elif isinstance(value, list):
            pending.extend(value)
        elif isinstance(value, int) and not isinstance(value, bool) and not INT64[0] <= value <= INT64[1]:
            return "holds an integer larger than 64 bits"
        elif isinstance(value, float) and not math.isfinite(value):
            return "holds NaN or Infinity, which JSON does not allow"
    return None


def parse_body(body: bytes, max_depth: int) -> dict[str, Any]:
    try:
        request = parse_json(body, max_depth)
    except JsonTooDeep as error:
        raise ApiError(
            400, f"The request body is {error}, more than this service accepts.", "invalid_json"
        ) from None
    except ValueError as error:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ApiError(400, f"The request body is not valid JSON ({error}).", "invalid_json") from None
    if not isinstance(request, dict):
        raise ApiError(400, "The request body must be a JSON object.", "invalid_json")
    if problem := number_problem(request):
        raise ApiError(400, f"The request body {problem}.", "invalid_json")
    return request


def check_request(path: str, request: dict[str, Any], settings: Settings) -> None:
    """Raise ApiError (400) for what the service does not accept; vLLM validates the rest."""
    unknown = sorted(set(request) - known_parameters(path))
    if unknown:
        raise ApiError(
            400,
            f"Unrecognized request argument supplied: {', '.join(unknown)}.",
            "unrecognized_argument",
            unknown[0],
        )
    entries_name = "messages" if path == "/v1/chat/completions" else "prompt"
    entries = request.get(entries_name)
    if entries_name == "messages" and entries == []:  # vLLM answers 400 too, but logs a traceback first
        raise ApiError(400, "'messages' is empty: send at least one message.", "invalid_value", "messages")
    if isinstance(entries, list) and len(entries) > settings.api_max_messages:
        raise ApiError(
            400,
            f"'{entries_name}' has {len(entries):,} entries; this service accepts at most "
            f"{settings.api_max_messages:,} per request.",
            "too_many_messages" if entries_name == "messages" else "too_many_prompts",
            entries_name,
        )
    check_sequences(path, request, settings.api_max_choices)


@cache
def _field_adapter(path: str, name: str) -> TypeAdapter:
    field = request_model(path).model_fields[name]
    return TypeAdapter(Annotated[field.annotation, *field.metadata] if field.metadata else field.annotation)


def as_vllm_reads(path: str, name: str, value: Any) -> Any:
    """`value` of the body field `name` as vLLM's request model for `path` will read it (`"8"`, `8.0`
    and `"8.0"` become 8 for an integer field), or None when the model refuses it (vLLM answers 400)."""
    try:
        return _field_adapter(path, name).validate_python(value)
    except ValidationError:
        return None


def prompt_count(path: str, request: dict[str, Any]) -> int:
    """How many prompts a request runs: one chat, or each prompt of a completions request (a text,
    a list of token ids, or each of a list of either) and each of its `prompt_embeds`."""
    if path == "/v1/chat/completions":
        return 1
    prompts = as_vllm_reads(path, "prompt", request.get("prompt"))
    embeds = as_vllm_reads(path, "prompt_embeds", request.get("prompt_embeds"))
    count = 0
    if isinstance(prompts, list):
        count += 1 if prompts and all(isinstance(item, int) for item in prompts) else len(prompts)
    elif prompts is not None:
        count += 1
    count += len(embeds) if isinstance(embeds, list) else int(embeds is not None)
    return max(count, 1)


def choice_count(path: str, request: dict[str, Any]) -> int:
    """`n` as vLLM reads it: the choices it runs of each prompt (1 when vLLM refuses the value)."""
    choices = as_vllm_reads(path, "n", request.get("n", 1))
    return choices if isinstance(choices, int) and choices > 1 else 1  # else vLLM refuses, or it is 1


def check_sequences(path: str, request: dict[str, Any], max_sequences: int) -> None:
    """Refuse a request that would run more than `max_sequences` sequences: `n` choices of each prompt."""
    choices = choice_count(path, request)
    prompts = prompt_count(path, request)
    if choices * prompts <= max_sequences:
        return
    if prompts == 1:
        raise ApiError(
            400,
            f"n={choices} is not supported: this service returns at most {max_sequences} "
            "choice(s) per request. Send separate requests instead.",
            "unsupported_value",
            "n",
        )
    raise ApiError(
        400,
        f"This request asks for {choices * prompts} choices ({prompts} prompts, n={choices}); this "
        f"service runs at most {max_sequences} per request. Send one prompt per request instead.",
        "too_many_choices",
        "prompt",
    )
