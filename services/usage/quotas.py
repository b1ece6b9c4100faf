"""Token budgets per day and per month: a person's budget (their own, else their role's), what is left
of each for a request (admission's `Room`, grants.py), and the refusal that says what is left and
when it resets.

What counts against a budget is prompt + answer tokens of chat turns (documents' summaries included)
and API requests: both are work the engine does for the person (reading the prompt, writing the
answer), and both are what the usage listing shows, so a person can check the numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from functools import partial

from services.admission.grants import Room
from services.admission.refusals import QUOTA_DAY, QUOTA_MONTH, Refused, rounded_seconds
from services.config import Settings
from services.usage.periods import DAY, MONTH, reset_of

__all__ = [
    "QUOTA_DAY",
    "QUOTA_MONTH",
    "Budget",
    "budget_rooms",
    "left_text",
    "over_budget",
    "person_budget",
    "role_budget",
]


@dataclass(frozen=True)
class Budget:
    """Tokens per UTC day and per UTC month; 0 = unlimited."""

    day: int = 0
    month: int = 0

    def of(self, period: str) -> int:
        return self.day if period == DAY else self.month


def role_budget(settings: Settings, role: str | None) -> Budget:
    """The default budget of a role (an unknown or missing role is a user's)."""
    if role == "admin":
        return Budget(settings.quota_tokens_per_day_admin, settings.quota_tokens_per_month_admin)
    return Budget(settings.quota_tokens_per_day_user, settings.quota_tokens_per_month_user)


def person_budget(settings: Settings, role: str | None, own: dict[str, int]) -> Budget:
    """The role's budget, with each period the person has a budget of their own for replaced."""
    default = role_budget(settings, role)
    return Budget(own.get(DAY, default.day), own.get(MONTH, default.month))


def over_budget(budget: Budget, used_day: int, used_month: int, now: datetime) -> Refused | None:
    """The refusal for a person who has used up a period's budget (the month first: it lasts longer)."""
    for period, used, reason in ((MONTH, used_month, QUOTA_MONTH), (DAY, used_day, QUOTA_DAY)):
        limit = budget.of(period)
        if limit and used >= limit:
            return _refusal(period, reason, limit, used, now)
    return None


def budget_rooms(budget: Budget, used_day: int, used_month: int, reserved: int, now: datetime) -> list[Room]:
    """What is left of each period's budget (the month first), `reserved` tokens of requests still
    running counted as used; a period without a budget leaves no room to check."""
    rooms = []
    for period, used, reason in ((MONTH, used_month, QUOTA_MONTH), (DAY, used_day, QUOTA_DAY)):
        limit = budget.of(period)
        if limit:
            short = partial(_short, period, reason, limit, used, reserved, now)
            rooms.append(Room(limit - used - reserved, True, short))
    return rooms


def _short(
    period: str, reason: str, limit: int, used: int, reserved: int, now: datetime, needed: int
) -> Refused:
    """The refusal of a request that needs `needed` tokens (its prompt and its shortest answer) when
    fewer are left of the period's budget."""
    if used >= limit:
        return _refusal(period, reason, limit, used, now)
    resets, wait = _reset(period, now)
    running = f" ({reserved:,} more are held by answers still running)" if reserved else ""
    return Refused(
        reason,
        f"This request needs up to {needed:,} tokens (its prompt and the shortest answer); "
        f"{max(0, limit - used - reserved):,} of your {limit:,} tokens for {_span(period)} are left"
        f"{running}. {resets}",
        wait,
    )


def _refusal(period: str, reason: str, limit: int, used: int, now: datetime) -> Refused:
    resets, wait = _reset(period, now)
    told = f"You have used {used:,} of your {limit:,} tokens for {_span(period)}: none left. {resets}"
    return Refused(reason, told, wait)


def _span(period: str) -> str:
    return "today (UTC)" if period == DAY else "this month (UTC)"


def _reset(period: str, now: datetime) -> tuple[str, float]:
    """When the period's budget resets, in words, and the seconds until then."""
    reset = reset_of(period, now)
    wait = (reset - now).total_seconds()
    when = "00:00 UTC" if period == DAY else f"{reset:%Y-%m-%d} 00:00 UTC"
    every = "daily" if period == DAY else "monthly"
    told = f"Your {every} budget resets at {when}, in ~{rounded_seconds(wait)}."
    return f"{told} An administrator can raise it.", wait


def left_text(budget: Budget, used_day: int, used_month: int, now: datetime) -> str:
    """What a person has left, for the /quota chat command."""
    lines = []
    for period, used, name in ((DAY, used_day, "today (UTC)"), (MONTH, used_month, "this month (UTC)")):
        limit = budget.of(period)
        reset = reset_of(period, now)
        if not limit:
            lines.append(f"{name}: {used:,} tokens used, no budget")
            continue
        lines.append(
            f"{name}: {used:,} of {limit:,} tokens used, {max(0, limit - used):,} left; "
            f"resets {reset:%Y-%m-%d %H:%M} UTC"
        )
    return "\n".join(lines)
