"""What a router in front of the vLLM servers needs to keep a conversation where its prefix is cached.

With ENGINE_ROUTER, routing is the router's (vLLM's router, production-stack's, an llm-d gateway):
each request to it carries its conversation's key and its person's key as headers. A chat turn
sets both for the task that runs it (`set_route_hint`); the remote backend reads them when it sends
the request. Both are one-way hashes: conversation ids and names stay in the app.
"""

from __future__ import annotations

import hashlib
from contextvars import ContextVar

# vLLM's router hashes on X-Session-Id (policy consistent_hash); production-stack's session router
# takes its header name as an option (--session-key x-session-id); llm-d's gateway keeps a fair
# share per x-gateway-inference-fairness-id.
SESSION_HEADER = "X-Session-Id"
PERSON_HEADERS = ("X-User-Id", "X-Gateway-Inference-Fairness-Id")

_hint: ContextVar[dict[str, str] | None] = ContextVar("route_hint", default=None)


def _key(kind: str, value: str) -> str:
    return hashlib.sha256(f"{kind}:{value}".encode()).hexdigest()[:32]


def set_route_hint(conversation: str, person: str) -> None:
    """From now on in the running task (a chat turn runs in its own), engine requests carry
    `conversation` and `person`, hashed, as headers. Other tasks are not touched."""
    headers = {SESSION_HEADER: _key("conversation", conversation)}
    headers.update(dict.fromkeys(PERSON_HEADERS, _key("person", person)))
    _hint.set(headers)


def route_headers() -> dict[str, str]:
    """The headers of the running turn's hint (none outside a turn)."""
    return dict(_hint.get() or {})
