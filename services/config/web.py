"""HTTP edge settings: how large and deep a JSON body may be before anything parses it for real."""

from __future__ import annotations

from dataclasses import dataclass

from services.config.fields import setting


@dataclass(frozen=True)
class WebSettings:
    """What browsers and HTTP clients may do at the app's edge."""

    max_json_depth: int = setting(
        64,
        "MAX_JSON_DEPTH",
        "Deepest nesting of a JSON request body (API and Chainlit's routes); deeper ones get 400 "
        "before they are parsed for real (Python's parser fails at ~1,000 levels with a RecursionError).",
        2,
    )
    max_json_body_bytes: int = setting(
        1_048_576,
        "MAX_JSON_BODY_BYTES",
        "Largest body of a request to Chainlit's own routes other than uploads (sign-in, conversation "
        "list, feedback, ...); a larger one gets 413. The API has API_MAX_BODY_BYTES.",
        1024,
    )
