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
        "it (its sweeps start every 5 minutes, so a user may briefly hold that long's more); 0 = no cap.",
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
    database_timeout_seconds: float = setting(
        5.0,
        "DATABASE_TIMEOUT_SECONDS",
        "Longest wait for a database connection or a locked SQLite file before the write counts as failed.",
        0.1,
    )
    history_retry_seconds: float = setting(
        5.0,
        "HISTORY_RETRY_SECONDS",
        "While the database is unavailable, how often it is tried again (chat goes on unsaved meanwhile).",
        0.5,
    )
