"""History settings: where conversations are stored, how long they are kept, how database trouble is met."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from services.config.fields import setting


def default_data_dir() -> str:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return str(Path(base) / "vllm-chat")


@dataclass(frozen=True)
class HistorySettings:
    """The database behind the sidebar's conversations and the accounts."""

    data_dir: str = setting(
        default_data_dir(),
        "DATA_DIR",
        "Folder of the SQLite database (`chat.db`) and the sign-in secret (`auth-secret`); created 0700.",
        tier="essential",
    )
    database_url: str = setting(
        "",
        "DATABASE_URL",
        "PostgreSQL URL (postgresql://user:password@host:5432/db) for conversations and accounts; "
        "empty = SQLite in DATA_DIR.",
        tier="essential",
    )
    chat_history: bool = setting(
        True,
        "CHAT_HISTORY",
        "Keep conversations in the database (sidebar, resume after a reload); false = nothing is stored.",
    )
    history_retention_days: float = setting(
        180.0,
        "HISTORY_RETENTION_DAYS",
        "Conversations idle for longer are deleted by the maintenance task; 0 = kept forever.",
        0,
    )
    history_max_conversations: int = setting(
        1000,
        "HISTORY_MAX_CONVERSATIONS",
        "Conversations kept per user: the maintenance task deletes the least recently active beyond "
        "it (every HISTORY_RETENTION_INTERVAL_SECONDS, so a user may briefly hold that long's more); "
        "0 = no cap.",
        0,
    )
    history_max_turns: int = setting(
        1000,
        "HISTORY_MAX_TURNS",
        "Turns (a message and its answer) kept per conversation: the maintenance task deletes a "
        "longer conversation's oldest turns, so one endless conversation cannot fill the database "
        "or a resume; 0 = no cap.",
        0,
    )
    history_retention_interval_seconds: float = setting(
        300.0,
        "HISTORY_RETENTION_INTERVAL_SECONDS",
        "How often retention and the per-user cap sweep: each sweep deletes a batch of 200 "
        "conversations per maintenance round until the rules hold. Short: small steady deletes "
        "beside the chat's saves; long: fewer scans of the whole history, in larger bursts.",
        1,
    )
    database_timeout_seconds: float = setting(
        5.0,
        "DATABASE_TIMEOUT_SECONDS",
        "Longest wait for a database connection or a locked SQLite file before the write counts as failed.",
        0.1,
    )
    sqlite_cache_kib: int = setting(
        512,
        "SQLITE_CACHE_KIB",
        "Page cache of each pooled SQLite connection, in KiB (SQLite's default is 2,000): the files "
        "stay in the operating system's cache, so a small one costs little and bounds the app's memory.",
        16,
    )
    history_retry_seconds: float = setting(
        5.0,
        "HISTORY_RETRY_SECONDS",
        "While the database is unavailable, how often it is tried again (chat goes on unsaved meanwhile).",
        0.5,
    )
