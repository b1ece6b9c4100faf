"""Usage per person per UTC day, and token budgets, in the app's database (the same DATA_DIR /
DATABASE_URL settings as the app). Safe to run while the app runs.

    python -m services.usage show [--user alice] [--days 30] [--csv]   # newest day first
    python -m services.usage quota show alice
    python -m services.usage quota set alice [--day 500000] [--month 10000000]   # 0 = unlimited
    python -m services.usage quota clear alice                         # back to her role's budgets

A budget change reaches running apps within USAGE_REFRESH_SECONDS.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from services.accounts.names import AccountError, normalize_username, parse_identity
from services.accounts.store import AccountStore
from services.config import Settings, SettingsError
from services.history.database import create_engine
from services.history.migrations import migrate
from services.usage.export import usage_csv, usage_table
from services.usage.periods import DAY, MONTH, days_back, month_start, utc_day, utc_now
from services.usage.quotas import person_budget, role_budget
from services.usage.store import MAX_ROWS, UsageStore

MAX_DAYS = 3660


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m services.usage", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    show = commands.add_parser("show", help="usage per person per UTC day, newest first")
    show.add_argument("--user", help="only this person")
    show.add_argument("--days", type=int, default=30, help="the last N days, today included (default 30)")
    show.add_argument("--limit", type=int, default=MAX_ROWS, help=f"rows at most (at most {MAX_ROWS:,})")
    show.add_argument("--csv", action="store_true", help="CSV with a header row, for spreadsheets")
    quota = commands.add_parser("quota", help="a person's token budgets: show, set, clear")
    actions = quota.add_subparsers(dest="quota_command", required=True)
    actions.add_parser("show", help="budgets and what is used").add_argument("username")
    change = actions.add_parser("set", help="give a person budgets of their own (0 = unlimited)")
    change.add_argument("username")
    change.add_argument("--day", type=int, help="tokens per UTC day")
    change.add_argument("--month", type=int, help="tokens per UTC calendar month")
    actions.add_parser("clear", help="back to the role's budgets").add_argument("username")
    return parser.parse_args(argv)


def identifier(name: str) -> str:
    """An account name or provider identity (github:login) as stored."""
    return parse_identity(name) if ":" in name else normalize_username(name)


async def run(arguments: argparse.Namespace, settings: Settings) -> str:
    engine = create_engine(settings)
    try:
        await migrate(engine)
        store = UsageStore(engine)
        if arguments.command == "show":
            return await _show(arguments, store)
        return await _quota(arguments, settings, store, AccountStore(engine))
    finally:
        await engine.dispose()


async def _show(arguments: argparse.Namespace, store: UsageStore) -> str:
    if not 1 <= arguments.days <= MAX_DAYS:
        raise AccountError(f"--days must be 1 to {MAX_DAYS}")
    person = identifier(arguments.user) if arguments.user else None
    rows = await store.days(person, days_back(utc_day(utc_now()), arguments.days), arguments.limit)
    return usage_csv(rows).rstrip("\n") if arguments.csv else usage_table(rows)


async def _quota(
    arguments: argparse.Namespace, settings: Settings, store: UsageStore, accounts: AccountStore
) -> str:
    person = identifier(arguments.username)
    account = await accounts.get(person)
    if account is None:
        raise AccountError(f"no account named {person!r}")
    if arguments.quota_command == "set":
        if arguments.day is None and arguments.month is None:
            raise AccountError("give --day, --month or both (tokens; 0 = unlimited)")
        for period, tokens in ((DAY, arguments.day), (MONTH, arguments.month)):
            if tokens is not None:
                if tokens < 0:
                    raise AccountError(f"--{period} must be 0 (unlimited) or more")
                await store.set_budget(person, period, tokens)
    elif arguments.quota_command == "clear":
        await store.clear_budget(person)
    own = (await store.budgets([person]))[person][1]
    return _budget_text(settings, person, account.role, own, await store.totals([person], utc_day(utc_now())))


def _budget_text(settings: Settings, person: str, role: str, own: dict[str, int], totals: dict) -> str:
    budget = person_budget(settings, role, own)
    default = role_budget(settings, role)
    used_day, used_month = totals.get(person, (0, 0))
    lines = [f"{person} ({role})"]
    for period, used, span in (
        (DAY, used_day, "today (UTC)"),
        (MONTH, used_month, f"since {month_start(utc_day(utc_now()))}"),
    ):
        limit = budget.of(period)
        source = "own budget" if period in own else f"{role}'s default"
        shown = f"{limit:,} tokens" if limit else "unlimited"
        left = f", {max(0, limit - used):,} left" if limit else ""
        role_default = f"{default.of(period):,}" if default.of(period) else "unlimited"
        lines.append(
            f"{period:<6} {shown} ({source}; role default {role_default}): {used:,} used {span}{left}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    arguments = parse_arguments(argv)
    try:
        print(asyncio.run(run(arguments, Settings.from_env())))
    except (AccountError, SettingsError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
