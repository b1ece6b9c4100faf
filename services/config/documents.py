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
    max_files_per_message: int = setting(5, "MAX_FILES_PER_MESSAGE", "Files read from one message.", 1)
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
