"""Overload settings: priority, admission by capacity, our waiting queue, fair share per user."""

from __future__ import annotations

from dataclasses import dataclass

from services.config.fields import setting


@dataclass(frozen=True)
class AdmissionSettings:
    """How the service shares one engine between many people when demand exceeds it."""

    priority_scheduling: bool = setting(
        True,
        "PRIORITY_SCHEDULING",
        "Chat turns before document-summary parts, in our queue and in vLLM's scheduler "
        "(`scheduling_policy=priority`; passed to ENGINE_URLS servers that accept it). "
        "false = first come, first served.",
    )
    document_aging_seconds: float = setting(
        30.0,
        "DOCUMENT_AGING_SECONDS",
        "A document part queues as if it had arrived this much later than it did: chat turns "
        "go first, but no chat turn that arrives later than that overtakes it, so long jobs "
        "cannot starve.",
        0,
    )
    document_slot_share: float = setting(
        0.25,
        "DOCUMENT_SLOT_SHARE",
        "Share of the running limit that document-summary parts may hold at once (at least one): "
        "the rest stays for chat, so a burst of uploads cannot fill every slot with long parts. "
        "1 = documents may take every slot.",
        0,
    )
    reading_pace_tokens_per_second: float = setting(
        5.0,
        "READING_PACE_TOKENS_PER_SECOND",
        "Admit another request to the engine only while every running stream keeps this pace; "
        "the running limit follows from the measured decode speed. 0 = admit everything at once "
        "(no waiting queue).",
        0,
    )
    admission_queue_max: int = setting(
        64,
        "ADMISSION_QUEUE_MAX",
        "Chat turns waiting in our queue at most; more are refused at once. Document parts wait "
        "besides them (at most SUMMARY_CONCURRENCY per summary in flight).",
        1,
    )
    admission_max_wait_seconds: float = setting(
        10.0,
        "ADMISSION_MAX_WAIT_SECONDS",
        "A chat turn whose estimated wait in our queue is longer is refused at once, with the "
        "estimate (the target: accepted turns see their first token within ~10 s). Longer = fewer "
        "refusals, longer waits (each shown with its place).",
        1,
    )
    user_max_concurrent_turns: int = setting(
        2,
        "USER_MAX_CONCURRENT_TURNS",
        "Turns one person (signed-in user, else client address) may have running or waiting "
        "at once, across all tabs. 0 = no limit.",
        0,
    )
    user_tokens_per_minute: int = setting(
        4000,
        "USER_TOKENS_PER_MINUTE",
        "Answer tokens one person may receive per sliding minute (chat and API together). Each engine "
        "request must fit what is left with its every sequence at its answer limit, answers still "
        "running counted in full: else its answers are cut to fit (MIN_CUT_ANSWER_TOKENS) or it is "
        "refused with the time to retry. 0 = no limit.",
        0,
    )
    min_cut_answer_tokens: int = setting(
        16,
        "MIN_CUT_ANSWER_TOKENS",
        "A request whose worst case (prompt + every sequence at its answer limit) does not fit what is "
        "left of its person's USER_TOKENS_PER_MINUTE or token budgets runs with shorter answers (a "
        "lower max_tokens) when at least this many tokens per sequence fit, or all it asked for when "
        "that is fewer; otherwise it is refused (429 with Retry-After on /v1).",
        1,
    )
    user_documents_per_hour: int = setting(
        20,
        "USER_DOCUMENTS_PER_HOUR",
        "Documents one person may upload per sliding hour. 0 = no limit.",
        0,
    )
    user_messages_per_minute: int = setting(
        30,
        "USER_MESSAGES_PER_MINUTE",
        "Chat messages one person may send per sliding minute (commands such as /key and /stats, and "
        "messages refused for their size, count too); more are refused before they are stored, with "
        "the time to retry. 0 = no limit.",
        0,
    )
    shared_limits: str = setting(
        "auto",
        "SHARED_LIMITS",
        "Where the USER_* limits above and failed sign-ins are counted: `auto` = in the database when "
        "DATABASE_URL is PostgreSQL (replicas on it give a person each limit once, not once per replica), "
        "else in this process; `on` = in the database (PostgreSQL only); `off` = each process counts its "
        "own. While the database cannot answer, each process counts its own.",
    )
    shared_line_seconds: float = setting(
        1.0,
        "SHARED_LINE_SECONDS",
        "With shared limits, how often each replica shares when its waiting chat turns arrived and reads "
        "the other replicas', with its stream pace (running requests, slowest stream, cap) and its "
        "document parts: turns then start first come, first served across replicas, each replica takes "
        "its share of the engine's free slots until the next exchange, the lowest pace cap holds for "
        "all, DOCUMENT_SLOT_SHARE and the one document prefill hold at the engine, and a "
        "waiting person's place and estimate and ADMISSION_QUEUE_MAX count everyone waiting. 0 = each "
        "replica's waiting line, pace and documents' share are its own.",
        0,
    )


SHARED_LIMITS_MODES = ("auto", "on", "off")


def is_postgres(database_url: str) -> bool:
    """Whether DATABASE_URL names PostgreSQL (postgresql:// or postgres://), which replicas can share."""
    return database_url.startswith("postgres")
