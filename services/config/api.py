"""OpenAI-compatible API settings: whether it is served, its model name, and the limits of one request."""

from __future__ import annotations

from dataclasses import dataclass

from services.config.fields import setting


@dataclass(frozen=True)
class ApiSettings:
    """The /v1 API next to the chat: what one request may ask for, and how many keys a person holds."""

    api_enabled: bool = setting(
        True,
        "API_ENABLED",
        "Serve the OpenAI-compatible API (/v1/chat/completions, /v1/completions, /v1/models) on the "
        "app's port, for holders of an API key.",
    )
    api_model_name: str = setting(
        "",
        "API_MODEL_NAME",
        "The model's name in the API (`model` of requests, /v1/models); empty = the model folder's name "
        "(SmolLM2-135M-Instruct for the default). The model path is accepted too.",
    )
    api_max_body_bytes: int = setting(
        4_194_304, "API_MAX_BODY_BYTES", "Largest API request body; a larger one gets 413 unread.", 1024
    )
    api_max_messages: int = setting(
        512, "API_MAX_MESSAGES", "Most entries in a request's `messages` (or `prompt`) array.", 1
    )
    api_max_choices: int = setting(
        1,
        "API_MAX_CHOICES",
        'Most choices one API request may ask for: `n` (as vLLM reads it: "8" and 8.0 are 8) times '
        "the prompts of a /v1/completions request (a list of prompts runs one sequence each). Each "
        "choice is one more sequence in the engine, so more would let one request take the share of "
        "several.",
        1,
    )
    api_aging_seconds: float = setting(
        30.0,
        "API_AGING_SECONDS",
        "How API traffic ranks against interactive chat in the admission queue (with PRIORITY_SCHEDULING): "
        "an API request waits as if it had arrived this many seconds later, so chat turns go first and "
        "API requests cannot starve. 0 = the same as chat.",
        0,
    )
    api_keys_per_user: int = setting(
        20, "API_KEYS_PER_USER", "API keys one person may hold at once (revoked keys do not count).", 1
    )
