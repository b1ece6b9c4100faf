"""The admin page's audit log: the newest entries by actor, action and time, and the same as CSV
(at most AUDIT_EXPORT_MAX_ROWS rows; the download itself is recorded)."""

from __future__ import annotations

from services.admin.html import Html, field, get_form, join, link, table, tag
from services.admin.sections import ADMIN_LIST_MAX_ROWS, ActionError, Section, Visit
from services.audit import actions
from services.audit.filters import AuditFilter, FilterError, to_csv
from services.audit.log import COLUMNS

DETAILS_SHOWN = 300  # characters of details per row on the page; the CSV has them whole


def chosen_filter(visit: Visit) -> AuditFilter:
    query = visit.query
    try:
        return AuditFilter.parse(query.get("actor", ""), query.get("action", ""), query.get("since", ""))
    except FilterError as error:
        raise ActionError(str(error)) from None


def _form(chosen: AuditFilter) -> Html:
    values = chosen.fields()
    return get_form(
        "/admin/audit",
        [
            field("Actor", "actor", value=values["actor"], maxlength="128", placeholder="alice, cli, system"),
            field(
                "Action",
                "action",
                value=values["action"],
                maxlength="81",
                list="audit-actions",
                placeholder="account. or sign_in.failed",
            ),
            field("Since", "since", value=values["since"], maxlength="40", placeholder="7d, 12h, 2026-12-01"),
        ],
        "Filter",
    )


def _action_names() -> Html:
    families = sorted({name.split(".")[0] + "." for name in actions.ALL})
    options = join(Html(f'<option value="{name}"></option>') for name in [*families, *actions.ALL])
    return Html(f'<datalist id="audit-actions">{options}</datalist>')


async def audit_page(visit: Visit) -> Html:
    if visit.audit is None:
        raise ActionError("The audit log needs the database, and this service runs without one.")
    chosen = chosen_filter(visit)
    limit = ADMIN_LIST_MAX_ROWS
    entries = await visit.audit.entries(chosen, limit)
    rows = [
        [
            e.at[:19].replace("T", " "),
            e.actor,
            e.action,
            e.target,
            e.address,
            tag("code", e.details if len(e.details) <= DETAILS_SHOWN else e.details[:DETAILS_SHOWN] + "…"),
        ]
        for e in entries
    ]
    export = link("/admin/audit.csv", "Download as CSV", chosen.fields())
    note = f"The newest {limit} that match: narrow the filter, or download." if len(entries) == limit else ""
    headers = ["At (UTC)", "Actor", "Action", "Target", "Address", "Details"]
    listing = table(headers, rows, "No entries match.")
    return join([_form(chosen), _action_names(), tag("p", export), listing, tag("p", note) if note else ""])


async def audit_csv(visit: Visit) -> str:
    """The entries that match, newest first, as CSV; the export is recorded."""
    if visit.audit is None:
        raise ActionError("The audit log needs the database, and this service runs without one.")
    chosen = chosen_filter(visit)
    entries = await visit.audit.entries(chosen, visit.runtime.settings.audit_export_max_rows)
    asked = " ".join(f"{name}={value}" for name, value in chosen.fields().items() if value)
    await visit.record(actions.AUDIT_EXPORTED, None, rows=len(entries), filters=asked or "none")
    return to_csv(entries, COLUMNS)


AUDIT = Section("audit", "Audit log", audit_page)
