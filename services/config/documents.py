"""Document settings: upload and extraction limits, summaries, retrieval."""

from __future__ import annotations

from dataclasses import dataclass

from services.config.fields import setting


@dataclass(frozen=True)
class DocumentSettings:
    """What an upload may be, how much of it is read, and how it is summarized."""

    max_upload_bytes: int = setting(
        20 * 1024 * 1024, "MAX_UPLOAD_BYTES", "Largest upload accepted (checked before it is read).", 1
    )
    upload_linger_seconds: float = setting(
        5.0,
        "UPLOAD_LINGER_SECONDS",
        "After refusing an upload, how long its unread rest is read and discarded, so the "
        "client sees the refusal instead of a connection reset.",
        0,
    )
    upload_session_wait_seconds: float = setting(
        10.0,
        "UPLOAD_SESSION_WAIT_SECONDS",
        "How long an upload waits for its page's connection (a file dropped as the page opens).",
        0,
    )
    max_files_per_message: int = setting(5, "MAX_FILES_PER_MESSAGE", "Files read from one message.", 1)
    document_threads: int = setting(
        2,
        "DOCUMENT_THREADS",
        "Uploads read and tokenized at once (others wait their turn). Each thread that tokenizes while "
        "others do makes vLLM's tokenizer pool keep one more copy (~8 MB with the default model) for "
        "the life of the process.",
        1,
    )
    max_document_pages: int = setting(500, "MAX_DOCUMENT_PAGES", "PDF pages read at most.", 1)
    max_document_chars: int = setting(
        1_000_000, "MAX_DOCUMENT_CHARS", "Characters of text kept from one document.", 1
    )
    max_document_tokens: int = setting(
        200_000, "MAX_DOCUMENT_TOKENS", "Documents longer than this are cut (and the user told).", 1
    )
    max_docx_uncompressed_bytes: int = setting(
        100 * 1024 * 1024, "MAX_DOCX_UNCOMPRESSED_BYTES", "Unpacked size a .docx may have (zip bombs).", 1
    )
    summary_concurrency: int = setting(
        8, "SUMMARY_CONCURRENCY", "Chunk summaries in flight at once per document (map step).", 1
    )
    summary_max_tokens: int = setting(400, "SUMMARY_MAX_TOKENS", "Length budget of a summary.", 16)
    summary_min_tokens: int = setting(
        64,
        "SUMMARY_MIN_TOKENS",
        "Shortest summary (vLLM's min_tokens), so a long document never gets a one-line summary; "
        "at most a quarter of the document and half of SUMMARY_MAX_TOKENS. Not for a request of the user's.",
        0,
    )
    summary_loop_recoveries: int = setting(
        1,
        "SUMMARY_LOOP_RECOVERIES",
        "Times a summary that starts repeating itself before SUMMARY_MIN_TOKENS is cut back to before "
        "the loop and goes on, forbidden to say again what it said; 0 = it ends there.",
        0,
    )
    summary_chunk_tokens: int = setting(
        2048, "SUMMARY_CHUNK_TOKENS", "Chunk size of the map step (smaller = more parallel).", 64
    )
    summary_map_tokens: int = setting(
        200, "SUMMARY_MAP_TOKENS", "Length budget of each part's summary in the map step.", 16
    )
    follow_up_turns: int = setting(
        3,
        "FOLLOW_UP_TURNS",
        "Follow-up turns a document read whole must leave room for (after its summary), so it stays "
        "the cached prefix of every question; a longer document is summarized in parts instead.",
        0,
    )
    follow_up_turn_tokens: int = setting(
        256, "FOLLOW_UP_TURN_TOKENS", "Tokens reserved per follow-up turn (question and answer).", 16
    )
    single_pass_max_tokens: int = setting(
        1_000_000,
        "SINGLE_PASS_MAX_TOKENS",
        "Longest document summarized in one pass even when it fits; longer ones go map-reduce. "
        "Off by default: with the default model on 2 CPU cores one pass wrote its first words "
        "sooner up to ~5,000 tokens and within 2 s of map-reduce above (BENCHMARKS.md, summary "
        "quality), and its follow-ups are served from the prefix cache. Lower it where map-reduce "
        "starts sooner.",
        1,
    )
    progress_interval_seconds: float = setting(
        2.0, "PROGRESS_INTERVAL_SECONDS", "Seconds between progress updates while a document is read.", 0.1
    )
    summary_cache_entries: int = setting(256, "SUMMARY_CACHE_ENTRIES", "Summaries cached at most.", 1)
    summary_cache_bytes: int = setting(
        8 * 1024 * 1024, "SUMMARY_CACHE_BYTES", "Total size of cached summaries.", 1
    )
    summary_cache_ttl_seconds: float = setting(
        86_400.0, "SUMMARY_CACHE_TTL_SECONDS", "How long a cached summary is reused.", 1
    )
    retrieval_top_k: int = setting(
        4, "RETRIEVAL_TOP_K", "Chunks quoted for a question when the document does not fit.", 1
    )
