"""Errors in OpenAI's shape: {"error": {"message", "type", "param", "code"}}, sent as plain ASGI."""

from __future__ import annotations

import json
from collections.abc import Callable
from http import HTTPStatus

# OpenAI's error types by status (what its SDK maps to AuthenticationError, RateLimitError, ...).
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable_error",
}


class ApiError(Exception):
    """A request the API refuses; `str()` is the message the caller reads."""

    def __init__(
        self,
        status: int,
        message: str,
        code: str | None = None,
        param: str | None = None,
        retry_after_seconds: float | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.param = param
        self.retry_after_seconds = retry_after_seconds

    def body(self) -> bytes:
        kind = ERROR_TYPES.get(self.status) or HTTPStatus(self.status).phrase.lower().replace(" ", "_")
        error = {"message": str(self), "type": kind, "param": self.param, "code": self.code}
        return json.dumps({"error": error}).encode()

    def headers(self) -> list[tuple[bytes, bytes]]:
        headers = [(b"content-type", b"application/json")]
        if self.status == 401:
            headers.append((b"www-authenticate", b"Bearer"))
        if self.retry_after_seconds is not None:
            headers.append((b"retry-after", str(max(1, round(self.retry_after_seconds))).encode()))
        return headers

    async def send(self, send: Callable) -> None:
        body = self.body()
        headers = [*self.headers(), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": self.status, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})


def normalize_error(status: int, body: bytes) -> bytes:
    """vLLM's error body in OpenAI's terms: `type` by status (vLLM puts its exception name there) and
    `code` a string or null (vLLM repeats the status as a number); the message is kept."""
    try:
        document = json.loads(body)
        error = document["error"]
    except (ValueError, KeyError, TypeError):
        return body
    if not isinstance(error, dict):
        return body
    error["type"] = ERROR_TYPES.get(status, error.get("type"))
    if status == 404 and error.get("param") == "model":
        error["code"] = "model_not_found"
    elif not isinstance(error.get("code"), str):
        error["code"] = None
    return json.dumps(document).encode()


def with_normalized_errors(send: Callable) -> Callable:
    """A `send` that passes responses through, except error responses, which are normalized whole."""
    held: dict = {}

    async def send_normalized(message: dict) -> None:
        if message["type"] == "http.response.start" and message["status"] >= 400:
            held["start"] = message
            held["body"] = b""
            return
        if "start" not in held or message["type"] != "http.response.body":
            await send(message)
            return
        held["body"] += message.get("body", b"")
        if message.get("more_body", False):
            return
        start = held.pop("start")
        body = normalize_error(start["status"], held.pop("body"))
        headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
        await send({**start, "headers": [*headers, (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body, "more_body": False})

    return send_normalized
