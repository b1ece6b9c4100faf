"""The periods usage is kept and budgeted by: UTC days and UTC calendar months, and when each resets."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

DAY = "day"
MONTH = "month"
PERIODS = (DAY, MONTH)


def utc_now() -> datetime:
    return datetime.now(UTC)


def utc_day(now: datetime) -> str:
    """The UTC day of `now` as stored ('2026-12-05'); a naive time is taken to be UTC."""
    moment = now.astimezone(UTC) if now.tzinfo is not None else now.replace(tzinfo=UTC)
    return moment.date().isoformat()


def month_start(day: str) -> str:
    """The first day of `day`'s month ('2026-12-01')."""
    return date.fromisoformat(day).replace(day=1).isoformat()


def next_day_reset(now: datetime) -> datetime:
    """The next UTC midnight after `now`: when a daily budget starts again."""
    start = datetime.fromisoformat(utc_day(now)).replace(tzinfo=UTC)
    return start + timedelta(days=1)


def next_month_reset(now: datetime) -> datetime:
    """00:00 UTC on the first of the month after `now`'s: when a monthly budget starts again."""
    first = date.fromisoformat(month_start(utc_day(now)))
    following = date(first.year + first.month // 12, first.month % 12 + 1, 1)
    return datetime(following.year, following.month, following.day, tzinfo=UTC)


def reset_of(period: str, now: datetime) -> datetime:
    return next_day_reset(now) if period == DAY else next_month_reset(now)


def days_back(today: str, days: int) -> str:
    """The first day of the `days` days ending with `today` (1 = today only)."""
    return (date.fromisoformat(today) - timedelta(days=max(1, days) - 1)).isoformat()


def days_of_month_until(day: str) -> list[str]:
    """Every day of `day`'s month from the first up to `day` itself."""
    last = date.fromisoformat(day)
    return [last.replace(day=number).isoformat() for number in range(1, last.day + 1)]
