"""Audit log and admin page settings: how long the audit log is kept, how large it and one entry
may grow, and how many rows the admin page and the audit command show."""

from __future__ import annotations

from dataclasses import dataclass

from services.config.fields import setting


@dataclass(frozen=True)
class AuditSettings:
    """The append-only audit log (services/audit/) and the /admin page that reads it."""

    audit_retention_days: float = setting(
        400.0,
        "AUDIT_RETENTION_DAYS",
        "Audit log entries older than this are deleted by the maintenance task (the only way an entry "
        "goes); 0 = kept forever (AUDIT_MAX_ROWS still applies).",
        0,
    )
    audit_max_rows: int = setting(
        1_000_000,
        "AUDIT_MAX_ROWS",
        "Most audit log entries kept: the maintenance task deletes the oldest beyond it, so a flood "
        "of failed sign-ins cannot fill the disk (~300 bytes an entry); 0 = no cap.",
        0,
    )
    audit_export_max_rows: int = setting(
        10_000,
        "AUDIT_EXPORT_MAX_ROWS",
        "Most rows one CSV export (the admin page) or `python -m services.accounts audit` gives.",
        1,
    )
