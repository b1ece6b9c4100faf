"""`python -m services.accounts audit`: the audit log, newest first, as a table or as CSV.

    python -m services.accounts audit                          # the newest 50 entries
    python -m services.accounts audit --since 7d --action account.   # every account change this week
    python -m services.accounts audit --actor alice --csv --limit 5000 > alice.csv

At most AUDIT_EXPORT_MAX_ROWS rows, whatever --limit asks. Reading does not record anything.
"""

from __future__ import annotations

import argparse

from services.audit.filters import AuditFilter, to_csv
from services.audit.log import COLUMNS, AuditLog
from services.audit.log_lines import one_line
from services.config import Settings

DEFAULT_ROWS = 50
DETAILS_SHOWN = 100  # in the table; the CSV has them whole


def add_audit_command(commands: argparse._SubParsersAction) -> None:
    audit = commands.add_parser("audit", help="show the audit log (newest first)")
    audit.add_argument("--since", default="", help="7d, 12h, 30m, 2w, or a date like 2026-12-01")
    audit.add_argument("--actor", default="", help="who did it (an account, cli or system)")
    audit.add_argument("--action", default="", help="an action like account.added, or account. for all")
    audit.add_argument("--csv", action="store_true", help="CSV with the whole details")
    audit.add_argument("--limit", type=int, default=DEFAULT_ROWS, help=f"most rows (default {DEFAULT_ROWS})")


async def run_audit_command(arguments: argparse.Namespace, audit: AuditLog, settings: Settings) -> str:
    chosen = AuditFilter.parse(arguments.actor, arguments.action, arguments.since)
    limit = max(1, min(arguments.limit, settings.audit_export_max_rows))
    entries = await audit.entries(chosen, limit)
    if arguments.csv:
        return to_csv(entries, COLUMNS).rstrip("\n")
    lines = [f"{'at (UTC)':<20} {'actor':<20} {'action':<24} {'target':<24} {'address':<16} details"]
    for e in entries:  # written before control characters were escaped on the way in: escaped here
        at, actor, action, target, address, details = (one_line(cell) for cell in e.row())
        details = details if len(details) <= DETAILS_SHOWN else details[:DETAILS_SHOWN] + "…"
        lines.append(f"{at[:19]:<20} {actor:<20} {action:<24} {target:<24} {address:<16} {details}")
    if len(entries) == limit:
        lines.append(f"(the newest {limit}; narrow with --since, --actor, --action or raise --limit)")
    return "\n".join(lines)
