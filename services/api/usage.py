"""How many answer tokens a /v1 response carried, read from the response on its way to the client.

Per-user token limits count API answers as they count chat answers. vLLM's layer reports
`usage.completion_tokens` in a whole (non-streaming) response and, when the caller asked for it, in
a stream's last event; otherwise the meter keeps the streamed text so its tokens can be counted once
the response ends. What it keeps is bounded by the request's own answer length.
"""

from __future__ import annotations

import json
from collections.abc import Callable, MutableMapping
from typing import Any


class AnswerMeter:
    """A `send` that passes every message on and notes the answer it carries."""

    def __init__(self, send: Callable) -> None:
        self._send = send
        self._streaming = False
        self._ok = False  # only successful responses carry an answer
        self._pending = b""  # a whole response, or the unfinished event of a stream
        self._texts: list[str] = []
        self.reported_tokens: int | None = None  # vLLM's own count, when the response had one

    async def __call__(self, message: MutableMapping[str, Any]) -> None:
        if message["type"] == "http.response.start":
            headers = dict(message.get("headers", []))
            self._streaming = headers.get(b"content-type", b"").startswith(b"text/event-stream")
            self._ok = message["status"] < 400
        elif message["type"] == "http.response.body" and self._ok:
            self._read(message.get("body", b""), finished=not message.get("more_body", False))
        await self._send(message)

    def tokens(self, count_tokens: Callable[[str], int]) -> int:
        """The answer's tokens: vLLM's count when it gave one, else the kept text counted."""
        if self.reported_tokens is not None:
            return self.reported_tokens
        return count_tokens("".join(self._texts)) if self._texts else 0

    def _read(self, body: bytes, finished: bool) -> None:
        self._pending += body
        if not self._streaming:
            if finished:
                self._note(self._pending)
                self._pending = b""
            return
        *events, self._pending = self._pending.split(b"\n\n")
        for event in events:
            for line in event.splitlines():
                if line.startswith(b"data:") and line[5:].strip() != b"[DONE]":
                    self._note(line[5:])

    def _note(self, payload: bytes) -> None:
        try:
            document = json.loads(payload)
        except ValueError:
            return
        if not isinstance(document, dict):
            return
        usage = document.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            self.reported_tokens = usage["completion_tokens"]
            return
        for choice in document.get("choices") or ():
            text = choice.get("text") or (choice.get("delta") or {}).get("content")
            if isinstance(text, str):
                self._texts.append(text)
