"""The admin page's usage and quotas: tokens, turns, documents, API calls and refusals per person per
UTC day (services/usage, the same rows as `python -m services.usage show`, as CSV too), and a
person's own token budgets per day and month (as `python -m services.usage quota set|clear`), each
change recorded in the audit log."""

from __future__ import annotations

from services.accounts.names import AccountError, normalize_username, parse_identity
from services.accounts.store import AccountStore
from services.admin.html import Html, field, get_form, join, link, post_form, table, tag
from services.admin.sections import ADMIN_LIST_MAX_ROWS, ActionError, Section, Visit
from services.audit import actions
from services.usage.export import usage_csv
from services.usage.periods import DAY, MONTH, days_back, utc_day, utc_now
from services.usage.quotas import person_budget
from services.usage.store import UsageDay, UsageStore

MAX_DAYS = 400
MAX_BUDGET_TOKENS = 10**12


def _store(visit: Visit) -> UsageStore:
    history = visit.runtime.history
    if history is None or history.engine is None:
        raise ActionError("Usage needs the database, and this service runs without one.")
    return UsageStore(history.engine)


def _person(raw: str) -> str:
    try:
        return parse_identity(raw) if ":" in raw else normalize_username(raw)
    except AccountError as error:
        raise ActionError(str(error)) from None


def _days(raw: str) -> int:
    if not raw.strip():
        return 30
    if not raw.strip().isdigit() or not 1 <= int(raw) <= MAX_DAYS:
        raise ActionError(f"Days is a whole number from 1 to {MAX_DAYS}.")
    return int(raw)


async def _rows(visit: Visit, limit: int) -> list[UsageDay]:
    query = visit.query
    person = _person(query["person"]) if query.get("person", "").strip() else None
    since = days_back(utc_day(utc_now()), _days(query.get("days", "")))
    return await _store(visit).days(person, since, limit)


async def _budgets(visit: Visit, people: list[str]) -> list[list[object]]:
    store = _store(visit)
    today = utc_day(utc_now())
    budgets = await store.budgets(people)
    totals = await store.totals(people, today)
    rows: list[list[object]] = []
    for person in people:
        role, own = budgets.get(person, (None, {}))
        budget = person_budget(visit.runtime.settings, role, own)
        day, month = totals.get(person, (0, 0))
        shown = [f"{limit:,}" if limit else "unlimited" for limit in (budget.day, budget.month)]
        source = "own" if own else f"{role or 'user'}'s default"
        rows.append([person, role or "", f"{day:,} of {shown[0]}", f"{month:,} of {shown[1]}", source])
    return rows


def _forms(visit: Visit) -> Html:
    token = visit.admin.csrf_token
    query = visit.query
    person = field("Person", "person", required="required", maxlength="128")
    return join(
        [
            get_form(
                "/admin/usage",
                [
                    field(
                        "Person",
                        "person",
                        value=query.get("person", ""),
                        maxlength="128",
                        placeholder="everyone",
                    ),
                    field("Days", "days", "number", query.get("days", "30"), min="1", max=str(MAX_DAYS)),
                ],
                "Show",
            ),
            post_form(
                "/admin/usage/set-quota",
                token,
                [
                    person,
                    field("Tokens per day", "day", "number", min="0", placeholder="unchanged; 0 = unlimited"),
                    field(
                        "Tokens per month", "month", "number", min="0", placeholder="unchanged; 0 = unlimited"
                    ),
                ],
                "Set budget",
            ),
            post_form("/admin/usage/clear-quota", token, [person], "Back to the role's budget"),
        ]
    )


HEADERS = [
    "Day (UTC)",
    "Person",
    "Prompt tokens",
    "Answer tokens",
    "Turns",
    "Documents",
    "API calls",
    "Refusals",
]


async def usage_page(visit: Visit) -> Html:
    limit = ADMIN_LIST_MAX_ROWS
    rows = await _rows(visit, limit)
    people = sorted({row.person for row in rows})[:limit]
    cells = [
        [
            r.day,
            r.person,
            f"{r.prompt_tokens:,}",
            f"{r.answer_tokens:,}",
            r.turns,
            r.documents,
            r.api_calls,
            r.refusals,
        ]
        for r in rows
    ]
    budgets = await _budgets(visit, people)
    shown = {key: value for key, value in visit.query.items() if key in ("person", "days")}
    note = tag("p", f"The newest {limit} rows: narrow the filter, or download.") if len(rows) == limit else ""
    return join(
        [
            _forms(visit),
            tag("h2", "Budgets"),
            table(
                ["Person", "Role", "Today", "This month", "Budget"], budgets, "Nobody used it in these days."
            ),
            tag("h2", "Per day"),
            tag("p", link("/admin/usage.csv", "Download as CSV", shown)),
            table(HEADERS, cells, "No usage in these days."),
            note,
        ]
    )


async def usage_csv_text(visit: Visit) -> str:
    """The rows that match, newest first, as CSV (at most AUDIT_EXPORT_MAX_ROWS); recorded."""
    rows = await _rows(visit, visit.runtime.settings.audit_export_max_rows)
    await visit.record(actions.USAGE_EXPORTED, visit.query.get("person") or None, rows=len(rows))
    return usage_csv(rows)


def _tokens(form: dict[str, str], name: str) -> int | None:
    raw = form.get(name, "").strip()
    if not raw:
        return None
    if not raw.isdigit() or int(raw) > MAX_BUDGET_TOKENS:
        raise ActionError(f"Tokens per {name} is a whole number from 0 (unlimited) to {MAX_BUDGET_TOKENS:,}.")
    return int(raw)


async def _account(visit: Visit, form: dict[str, str]) -> str:
    history = visit.runtime.history
    person = _person(form.get("person", ""))
    if history is None or history.engine is None or await AccountStore(history.engine).get(person) is None:
        raise ActionError(f"No account named {person!r}.")
    return person


async def _refresh(visit: Visit) -> None:
    """This process sees the change at once; other replicas within USAGE_REFRESH_SECONDS."""
    serving = visit.runtime.running()
    if serving is not None and serving.usage is not None:
        await serving.usage.refresh()


async def set_quota(visit: Visit, form: dict[str, str]) -> str:
    person = await _account(visit, form)
    day = _tokens(form, DAY)
    month = _tokens(form, MONTH)
    if day is None and month is None:
        raise ActionError("Give tokens per day, per month or both (0 = unlimited).")
    store = _store(visit)
    for period, tokens in ((DAY, day), (MONTH, month)):
        if tokens is not None:
            await store.set_budget(person, period, tokens)
    await visit.record(actions.QUOTA_SET, person, day=day, month=month)
    await _refresh(visit)
    return f"{person}'s budget is set."


async def clear_quota(visit: Visit, form: dict[str, str]) -> str:
    person = await _account(visit, form)
    removed = await _store(visit).clear_budget(person)
    await visit.record(actions.QUOTA_CLEARED, person, removed=removed)
    await _refresh(visit)
    return f"{person} has the role's budget again."


USAGE = Section("usage", "Usage and quotas", usage_page, {"set-quota": set_quota, "clear-quota": clear_quota})
