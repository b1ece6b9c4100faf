"""Which audit entries to show: by actor, by action (a whole name, or `account.` for a family) and
since when; parsed from what a person typed (the admin page's form, the command's options), every
value checked, and turned into one parameterised WHERE clause."""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from services.audit.details import ACTOR_CHARS

_ACTION = re.compile(r"^[a-z_]{1,40}(\.[a-z_]{0,40})?$")
_RELATIVE = re.compile(r"^(\d{1,6})([mhdw])$")
_UNITS = {"m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")  # a spreadsheet would run a cell that starts so


def timestamp(at: datetime) -> str:
    """UTC with microseconds and a Z, always the same width, so stored times compare as text."""
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class FilterError(ValueError):
    """A filter value that is not one (the message says what is expected)."""


def parse_since(value: str, now: datetime | None = None) -> datetime | None:
    """`7d`, `12h`, `30m`, `2w` ago, or a date / date and time (ISO, UTC unless it says); None for ""."""
    value = value.strip()
    if not value:
        return None
    expected = "7d, 12h, 2026-12-01 or 2026-12-01T08:00"
    if len(value) > 40:
        raise FilterError(f"since: at most 40 characters, like {expected}")
    now = now or datetime.now(UTC)
    if match := _RELATIVE.match(value):
        return now - timedelta(**{_UNITS[match[2]]: int(match[1])})
    try:
        moment = datetime.fromisoformat(value.removesuffix("Z").removesuffix("z"))
    except ValueError:
        raise FilterError(f"since: {value[:40]!r} is not like {expected}") from None
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


@dataclass(frozen=True)
class AuditFilter:
    actor: str = ""
    action: str = ""
    since: datetime | None = None

    @classmethod
    def parse(cls, actor: str = "", action: str = "", since: str = "") -> AuditFilter:
        """From typed text; raises FilterError naming the bad field."""
        actor = actor.strip()
        action = action.strip().lower()
        if len(actor) > ACTOR_CHARS or any(ord(c) < 32 for c in actor):
            raise FilterError(f"actor: at most {ACTOR_CHARS} printable characters")
        if action and not _ACTION.match(action):
            raise FilterError("action: a name like account.added, or account. for all account actions")
        return cls(actor, action, parse_since(since))

    def where(self) -> tuple[str, dict[str, Any]]:
        """(" WHERE ...", its parameters), or ("", {}) when nothing is chosen."""
        conditions = []
        values = {}
        if self.actor:
            conditions.append("actor = :actor")
            values["actor"] = self.actor
        if self.action.endswith("."):  # only [a-z_.]: no LIKE wildcard can be in it
            conditions.append("action LIKE :action")
            values["action"] = self.action + "%"
        elif self.action:
            conditions.append("action = :action")
            values["action"] = self.action
        if self.since is not None:
            conditions.append("at >= :since")
            values["since"] = timestamp(self.since)
        return (" WHERE " + " AND ".join(conditions) if conditions else ""), values

    def fields(self) -> dict[str, str]:
        """The filter as form fields (to fill the form again, and for the CSV link)."""
        since = self.since.strftime("%Y-%m-%dT%H:%M") if self.since else ""
        return {"actor": self.actor, "action": self.action, "since": since}


class Row(Protocol):
    def row(self) -> tuple[str, ...]: ...


def safe_cell(value: str) -> str:
    """A CSV cell a spreadsheet shows as text: one starting like a formula gets a leading quote."""
    return "'" + value if value.startswith(FORMULA_STARTS) else value


def to_csv(entries: list[Row], header: tuple[str, ...]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(header)
    writer.writerows([safe_cell(value) for value in entry.row()] for entry in entries)
    return buffer.getvalue()
