"""Usage and quota settings: what is kept per person per day, and the token budgets per day and month."""

from __future__ import annotations

from dataclasses import dataclass

from services.config.fields import setting


@dataclass(frozen=True)
class UsageSettings:
    """Usage kept per signed-in person per UTC day, and their token budgets (services/usage)."""

    usage_accounting: bool = setting(
        True,
        "USAGE_ACCOUNTING",
        "Keep each signed-in person's usage per UTC day in the database (tokens, turns, documents, API "
        "calls, refusals) and enforce the QUOTA_* budgets; false = neither.",
    )
    usage_flush_seconds: float = setting(
        5.0,
        "USAGE_FLUSH_SECONDS",
        "Usage is counted in memory and written to the database this often (and at shutdown), so a turn "
        "never waits for the database.",
        0.1,
    )
    usage_retention_days: int = setting(
        400,
        "USAGE_RETENTION_DAYS",
        "Usage rows older than this many days are deleted by the maintenance task; 0 = kept forever.",
        0,
    )
    usage_refresh_seconds: float = setting(
        30.0,
        "USAGE_REFRESH_SECONDS",
        "Each process re-reads the running totals and budgets of the people it checks this often: usage "
        "on other replicas and budgets an administrator changed count here within USAGE_FLUSH_SECONDS + "
        "this.",
        0.5,
    )
    quota_tokens_per_day_user: int = setting(
        2_000_000,
        "QUOTA_TOKENS_PER_DAY_USER",
        "Tokens (prompt + answer, chat and API together) a person of role user may use per UTC day; "
        "a request runs only with its worst case within what is left, its answers cut to fit "
        "(MIN_CUT_ANSWER_TOKENS) or it is refused. 0 = unlimited. "
        "`python -m services.usage quota set` gives one person another budget.",
        0,
    )
    quota_tokens_per_month_user: int = setting(
        30_000_000,
        "QUOTA_TOKENS_PER_MONTH_USER",
        "Tokens (prompt + answer) a person of role user may use per calendar month (UTC); 0 = unlimited.",
        0,
    )
    quota_tokens_per_day_admin: int = setting(
        0,
        "QUOTA_TOKENS_PER_DAY_ADMIN",
        "Tokens an administrator may use per UTC day; 0 = unlimited.",
        0,
    )
    quota_tokens_per_month_admin: int = setting(
        0,
        "QUOTA_TOKENS_PER_MONTH_ADMIN",
        "Tokens an administrator may use per calendar month (UTC); 0 = unlimited.",
        0,
    )
