"""Chat settings: sampling defaults, message and history limits, the session cache."""

from __future__ import annotations

from dataclasses import dataclass

from services.config.fields import setting

SOCKET_EVENT_ENVELOPE_BYTES = 64 * 1024  # a message's id, metadata, file references, JSON framing


@dataclass(frozen=True)
class ChatSettings:
    """What a conversation may hold and how answers are sampled by default."""

    system_prompt: str = setting(
        "You are a helpful, concise assistant.", "SYSTEM_PROMPT", "Default system prompt."
    )
    temperature: float = setting(0.2, "TEMPERATURE", "Default sampling temperature.", 0)
    top_p: float = setting(0.9, "TOP_P", "Default nucleus sampling top_p.", 0.01)
    repetition_penalty: float = setting(
        1.0,
        "REPETITION_PENALTY",
        "Default vLLM repetition_penalty (> 1 discourages tokens already in the prompt or answer; "
        "1 = off). Chosen by measurement: BENCHMARKS.md, sampling defaults.",
        0.01,
    )
    frequency_penalty: float = setting(
        1.0,
        "FREQUENCY_PENALTY",
        "Default vLLM frequency_penalty (> 0 discourages answer tokens by how often they already "
        "occurred; 0 = off). Chosen by measurement: BENCHMARKS.md, sampling defaults.",
        -2,
    )
    loop_guard_min_tokens: int = setting(
        32,
        "LOOP_GUARD_MIN_TOKENS",
        "The loop guard stops an answer (and aborts its engine request) once a unit of tokens has "
        "been repeated exactly over this many tokens (its other thresholds: services/engine/loop_guard.py); "
        "0 = off, the paraphrase guard of summaries too.",
        0,
    )
    max_new_tokens: int = setting(512, "MAX_NEW_TOKENS", "Default answer budget in tokens.", 1)
    max_new_tokens_limit: int = setting(
        4096, "MAX_NEW_TOKENS_LIMIT", "Largest answer budget a user may pick in chat settings.", 1
    )
    max_message_chars: int = setting(
        100_000,
        "MAX_MESSAGE_CHARS",
        "Longest chat message (and system prompt) accepted, in characters; a longer one is refused "
        "before it is stored. The socket takes events of up to 4 bytes a character plus 64 KiB "
        "(UTF-8 at worst, and the event around the text); a larger one ends the connection.",
        1,
    )
    max_history_messages: int = setting(
        200, "MAX_HISTORY_MESSAGES", "Messages kept per session before the oldest are dropped.", 2
    )
    max_sessions: int = setting(
        1000, "MAX_SESSIONS", "Sessions kept at once; the least recently used is evicted.", 1
    )
    session_ttl_seconds: float = setting(
        3600.0, "SESSION_TTL_SECONDS", "Idle time after which a session is dropped.", 1
    )

    @property
    def socket_max_event_bytes(self) -> int:
        """The largest socket.io event (one message with its envelope) the socket reads, in bytes."""
        return 4 * self.max_message_chars + SOCKET_EVENT_ENVELOPE_BYTES
