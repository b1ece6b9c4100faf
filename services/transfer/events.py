"""What export, import and sharing record about themselves: one call per event, in one place."""

from __future__ import annotations

import logging

from services.audit.log import AuditLog

logger = logging.getLogger("services.transfer")

# The events, by name: conversation.exported (format md or json), conversations.exported (the
# archive of all), conversations.imported (how many, the file's format), conversations.import_refused
# (why), share.created, share.revoked (how many links), share.opened (an anonymous reader; no token).
EVENTS = (
    "conversation.exported",
    "conversations.exported",
    "conversations.imported",
    "conversations.import_refused",
    "share.created",
    "share.revoked",
    "share.opened",
)


def transfer_event(audit: AuditLog | None, event: str, who: str | None, **details: object) -> None:
    """Record one export, import or share event (`who`: the person, None for a share's reader) in the
    log and, in the background, the audit log. Never given a share token or a conversation's text."""
    assert event in EVENTS, event
    logger.info("%s by %s %s", event, who or "(anonymous)", details)
    if audit is not None:
        target = details.get("thread_id")
        audit.record_soon(who, event, str(target) if target else None, details)
