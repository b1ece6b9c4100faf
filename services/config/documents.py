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
    max_files_per_message: int = setting(5, "MAX_FILES_PER_MESSAGE", "Files read from one message.", 1)
    # Files uploaded but not yet sent in a message sit in Chainlit's session folder: these bound them, so
    # uploads that are never sent cannot fill the disk. A chat holds one full message (5 files of 20 MB).
    unsent_uploads_per_session: int = setting(
        10,
        "UNSENT_UPLOADS_PER_SESSION",
        "Files one chat may hold uploaded but not yet sent in a message; the next upload gets 429.",
        1,
    )
    unsent_upload_mb_per_session: int = setting(
        100,
        "UNSENT_UPLOAD_MB_PER_SESSION",
        "Megabytes one chat may hold uploaded but not yet sent; an upload past it gets 413.",
        1,
    )
    unsent_uploads_per_person: int = setting(
        20,
        "UNSENT_UPLOADS_PER_PERSON",
        "Files one person (or address, without sign-in) may hold uploaded but not yet sent, across "
        "their chats in this process; the next upload gets 429.",
        1,
    )
    unsent_upload_mb_per_person: int = setting(
        200,
        "UNSENT_UPLOAD_MB_PER_PERSON",
        "Megabytes one person may hold uploaded but not yet sent, across their chats; past it, 413.",
        1,
    )
    unsent_upload_seconds: float = setting(
        900.0,
        "UNSENT_UPLOAD_SECONDS",
        "An upload not sent in a message within this time is deleted (at the next maintenance round), "
        "whether or not its page is still open; sent files stay with their chat.",
        1,
    )
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
    summary_chunk_tokens: int = setting(
        2048, "SUMMARY_CHUNK_TOKENS", "Chunk size of the map step (smaller = more parallel).", 64
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
