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
        "been repeated exactly over this many tokens; 0 = off.",
        0,
    )
    loop_guard_min_repeats: int = setting(
        3, "LOOP_GUARD_MIN_REPEATS", "Copies of the repeated unit before the loop guard fires.", 2
    )
    loop_guard_max_period_tokens: int = setting(
        256, "LOOP_GUARD_MAX_PERIOD_TOKENS", "Longest repeated unit, in tokens, the loop guard looks for.", 1
    )
    loop_guard_echo_window: int = setting(
        8,
        "LOOP_GUARD_ECHO_WINDOW",
        "Summaries only: the loop guard also stops a summary once LOOP_GUARD_ECHO_SHARE of its last "
        "this many word 4-grams already appeared in it (a loop in paraphrase); 0 = off.",
        0,
    )
    loop_guard_echo_share: float = setting(
        0.6, "LOOP_GUARD_ECHO_SHARE", "Share of repeated word 4-grams that stops a summary.", 0.01
    )
    loop_guard_echo_sentence_share: float = setting(
        0.7,
        "LOOP_GUARD_ECHO_SENTENCE_SHARE",
        "Summaries only: a sentence of prose (5+ words, not a list item) whose character 5-grams are "
        "this share or more already in the summary stops it there (a sentence again, misspelled).",
        0.01,
    )
    answer_token_cache_tokens: int = setting(
        262_144,
        "ANSWER_TOKEN_CACHE_TOKENS",
        "Token ids of recent answers kept (for SESSION_TTL_SECONDS) so a follow-up quotes them "
        "exactly and vLLM's prefix cache serves them; each answer counts 128 more (its overhead), "
        "~4 bytes a unit: ~1 MB at most by default; 0 = off.",
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
    max_sessions_awaiting_reconnect: int = setting(
        200,
        "MAX_SESSIONS_AWAITING_RECONNECT",
        "Sessions whose page went away kept for its return (Chainlit's session_timeout) at most; beyond "
        "it the longest gone are dropped at once, Chainlit's copy too (a storm of closed tabs).",
        0,
    )
    session_ttl_seconds: float = setting(
        3600.0, "SESSION_TTL_SECONDS", "Idle time after which a session is dropped.", 1
    )

    @property
    def socket_max_event_bytes(self) -> int:
        """The largest socket.io event (one message with its envelope) the socket reads, in bytes."""
        return 4 * self.max_message_chars + SOCKET_EVENT_ENVELOPE_BYTES
