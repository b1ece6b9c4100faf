"""Export, import and share-by-link settings: how much one export or import may hold, how much
one person may import per hour and day, and whether read-only share links exist at all (off unless
SHARING=true)."""

from __future__ import annotations

from dataclasses import dataclass

from services.config.fields import setting


@dataclass(frozen=True)
class TransferSettings:
    """Conversations leaving the app (export, share links) and coming in (import)."""

    export_max_conversations: int = setting(
        1000,
        "EXPORT_MAX_CONVERSATIONS",
        "Most conversations in one archive of all of a person's conversations (the most recently "
        "active first); the archive says when some were left out. Each is read and written one at a "
        "time, so the export holds one conversation in memory.",
        1,
    )
    import_max_bytes: int = setting(
        20 * 1024 * 1024,
        "IMPORT_MAX_BYTES",
        "Largest file `/import` and POST /conversations/import accept (the app's archive, its "
        "Markdown export, or ChatGPT's conversations.json); a larger one is refused before it is read.",
        1,
    )
    import_max_conversations: int = setting(
        500,
        "IMPORT_MAX_CONVERSATIONS",
        "Most conversations one import may bring; a file with more is refused whole.",
        1,
    )
    import_max_messages: int = setting(
        2000,
        "IMPORT_MAX_MESSAGES",
        "Most messages of one imported conversation; a conversation with more is refused (the whole file).",
        1,
    )
    import_max_message_chars: int = setting(
        100_000,
        "IMPORT_MAX_MESSAGE_CHARS",
        "Longest text of one imported message; a longer one is refused (the whole file).",
        1,
    )
    import_max_stored_messages: int = setting(
        20_000,
        "IMPORT_MAX_STORED_MESSAGES",
        "Most messages one import stores, all its conversations together (empty ones are left out "
        "and not counted); a file with more is refused whole. With IMPORT_MAX_STORED_BYTES, what bounds "
        "one import's database writes: it is stored in short batches beside the chat.",
        1,
    )
    import_max_stored_bytes: int = setting(
        8 * 1024 * 1024,
        "IMPORT_MAX_STORED_BYTES",
        "Most text one import stores (its titles and messages, in UTF-8 bytes); a file with more is "
        "refused whole.",
        1,
    )
    import_max_per_hour: int = setting(
        20,
        "IMPORT_MAX_PER_HOUR",
        "Imports one person may start in an hour (refused files count too: each is read); more are "
        "refused, saying when to try again. Each person has one import at a time.",
        1,
    )
    import_max_per_day: int = setting(
        100,
        "IMPORT_MAX_PER_DAY",
        "Imports one person may start per UTC day (refused files count too).",
        1,
    )
    import_max_messages_per_day: int = setting(
        40_000,
        "IMPORT_MAX_MESSAGES_PER_DAY",
        "Most messages one person's imports store per UTC day; a file that would pass it is refused "
        "whole, saying how many are left today.",
        1,
    )
    import_max_stored_bytes_per_day: int = setting(
        16 * 1024 * 1024,
        "IMPORT_MAX_STORED_BYTES_PER_DAY",
        "Most text (UTF-8 bytes) one person's imports store per UTC day. The database grows by about 7 "
        "times the text (messages' rows and the search index): 16 MiB of text, ~120 MB on SQLite.",
        1,
    )
    import_max_running: int = setting(
        2,
        "IMPORT_MAX_RUNNING",
        "Imports this process runs at once, everyone's together (each holds its file in memory, and a "
        "child process reading it about 10 times the file at most); another is refused, to be tried "
        "again in a minute.",
        1,
    )
    sharing: bool = setting(
        False,
        "SHARING",
        "Let people share a read-only copy of a conversation by an unguessable link (`/share` in the "
        "chat); false = every share route answers 404. SECURITY.md says what a link shows.",
        tier="essential",
    )
    share_ttl_days: float = setting(
        30.0,
        "SHARE_TTL_DAYS",
        "How long a share link works after it is made (its owner can revoke it sooner).",
        0.01,
    )
