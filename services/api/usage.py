"""How many answer tokens a /v1 response carried, read from the response on its way to the client,
and how many prompt tokens its request had.

Per-user token limits count API answers as they count chat answers; usage and budgets
(services/usage) count prompt tokens too: vLLM's `usage.prompt_tokens` when the response has it, else
the request's prompt text counted (token ids as given). vLLM's layer reports
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

    def __init__(self, send: Callable, request: Any = None) -> None:
        """`request`: the parsed request body, whose prompt is counted when vLLM reports no usage."""
        self._send = send
        self.request = request
        self.reported_prompt_tokens: int | None = None
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

    def prompt_tokens(self, count_tokens: Callable[[str], int]) -> int:
        """The request's prompt tokens (0 when the response was an error: the engine read nothing)."""
        if not self._ok:
            return 0
        if self.reported_prompt_tokens is not None:
            return self.reported_prompt_tokens
        texts, ids = prompt_parts(self.request)
        return ids + (count_tokens("\n".join(texts)) if texts else 0)

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
            if isinstance(usage.get("prompt_tokens"), int):
                self.reported_prompt_tokens = usage["prompt_tokens"]
            return
        for choice in document.get("choices") or ():
            text = choice.get("text") or (choice.get("delta") or {}).get("content")
            if isinstance(text, str):
                self._texts.append(text)


def prompt_parts(request: Any) -> tuple[list[str], int]:
    """(texts, token ids) of a request's prompt: the messages' text content of a chat request, the
    `prompt` of a completion (a string, strings, token ids or lists of them). Anything else: nothing."""
    if not isinstance(request, dict):
        return [], 0
    texts: list[str] = []
    ids = 0
    for message in request.get("messages") or ():
        content = message.get("content") if isinstance(message, dict) else None
        parts = content if isinstance(content, list) else [content]
        for part in parts:
            text = part.get("text") if isinstance(part, dict) else part
            if isinstance(text, str):
                texts.append(text)
    prompt = request.get("prompt")
    for item in prompt if isinstance(prompt, list) else [prompt]:
        if isinstance(item, str):
            texts.append(item)
        elif isinstance(item, int):
            ids += 1
        elif isinstance(item, list):
            ids += sum(1 for value in item if isinstance(value, int))
    return texts, ids
