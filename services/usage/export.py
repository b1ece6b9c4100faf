"""Usage as text: a table for the terminal and CSV for spreadsheets, from the same rows."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable

from services.usage.batch import COUNTERS
from services.usage.store import UsageDay

HEADER = ("person", "day", *COUNTERS)
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")  # a spreadsheet would run a cell starting so


def safe_cell(value: object) -> object:
    """A name as a spreadsheet shows it, never as a formula (a leading ' keeps it text)."""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


def usage_csv(days: Iterable[UsageDay]) -> str:
    """CSV with a header row: person, day and every counter; names made safe for spreadsheets."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(HEADER)
    for day in days:
        writer.writerow([safe_cell(value) for value in day.row()])
    return out.getvalue()


def usage_table(days: Iterable[UsageDay]) -> str:
    """Aligned columns for the terminal; names shown printable (repr of anything unprintable)."""
    head = f"{'person':<32} {'day':<10} {'prompt':>10} {'answer':>10} {'turns':>6} {'docs':>5} {'api':>6}"
    lines = [head + " refused"]
    for d in days:
        name = d.person if d.person.isprintable() else repr(d.person)
        lines.append(
            f"{name:<32} {d.day:<10} {d.prompt_tokens:>10,} {d.answer_tokens:>10,} {d.turns:>6,} "
            f"{d.documents:>5,} {d.api_calls:>6,} {d.refusals:,}"
        )
    return "\n".join(lines)
