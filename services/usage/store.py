"""Usage and budgets in the database (SQLite or PostgreSQL): adding a batch of counts, reading days
and running totals, a person's own budget, and retention. Every read is bounded."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import astuple, dataclass
from datetime import UTC, datetime

from sqlalchemy import bindparam, text
from sqlalchemy.ext.asyncio import AsyncEngine

from services.usage.batch import COUNTERS, Key
from services.usage.periods import PERIODS, month_start

MAX_ROWS = 10_000  # rows one read returns at most, whatever it asks for
IN_CHUNK = 500  # people per `IN (...)` list
_COLUMNS = ", ".join(COUNTERS)
_ADD = (
    f"INSERT INTO usage_days (person, day, {_COLUMNS}, updated_at) "
    f"VALUES (:person, :day, {', '.join(':' + name for name in COUNTERS)}, :now) "
    "ON CONFLICT (person, day) DO UPDATE SET "
    + ", ".join(f"{name} = usage_days.{name} + excluded.{name}" for name in COUNTERS)
    + ", updated_at = excluded.updated_at"
)


@dataclass(frozen=True)
class UsageDay:
    """One person's usage on one UTC day."""

    person: str
    day: str
    prompt_tokens: int = 0
    answer_tokens: int = 0
    turns: int = 0
    documents: int = 0
    api_calls: int = 0
    refusals: int = 0

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.answer_tokens

    def row(self) -> tuple:
        return astuple(self)


def _now() -> str:
    return datetime.now(UTC).isoformat()


def _chunks(people: Iterable[str]) -> Iterable[list[str]]:
    people = sorted(set(people))
    for start in range(0, len(people), IN_CHUNK):
        yield people[start : start + IN_CHUNK]


class UsageStore:
    """The usage_days and quotas tables; every method is one short transaction."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    async def add(self, rows: dict[Key, list[int]]) -> None:
        """Add each row's counts to the stored ones (replicas add up, never overwrite). Rows go in key
        order, so two replicas writing the same people lock their rows in the same order (no deadlock)."""
        if not rows:
            return
        now = _now()
        values = [
            {"person": person, "day": day, "now": now, **dict(zip(COUNTERS, counts, strict=True))}
            for (person, day), counts in sorted(rows.items())
        ]
        async with self.engine.begin() as connection:
            await connection.execute(text(_ADD), values)

    async def days(
        self, person: str | None = None, since: str | None = None, limit: int = MAX_ROWS
    ) -> list[UsageDay]:
        """Rows from `since` (a 'YYYY-MM-DD' day) on, of one person or everyone, newest day first;
        at most `limit` (and never more than MAX_ROWS)."""
        where = []
        values = {"limit": max(0, min(int(limit), MAX_ROWS))}
        if person is not None:
            where.append("person = :person")
            values["person"] = person
        if since is not None:
            where.append("day >= :since")
            values["since"] = since
        sql = f"SELECT person, day, {_COLUMNS} FROM usage_days"
        sql += f" WHERE {' AND '.join(where)}" if where else ""
        async with self.engine.connect() as connection:
            result = await connection.execute(text(sql + " ORDER BY day DESC, person LIMIT :limit"), values)
            return [UsageDay(row[0], row[1], *(int(v) for v in row[2:])) for row in result]

    async def totals(self, people: Iterable[str], today: str) -> dict[str, tuple[int, int]]:
        """Person: (tokens today, tokens this month) as stored (people without rows: absent)."""
        sql = text(
            "SELECT person, SUM(CASE WHEN day = :today THEN prompt_tokens + answer_tokens ELSE 0 END), "
            "SUM(prompt_tokens + answer_tokens) FROM usage_days "
            "WHERE day >= :first AND day <= :today AND person IN :people GROUP BY person"
        ).bindparams(bindparam("people", expanding=True))
        found: dict[str, tuple[int, int]] = {}
        async with self.engine.connect() as connection:
            for chunk in _chunks(people):
                values = {"today": today, "first": month_start(today), "people": chunk}
                for person, day, month in await connection.execute(sql, values):
                    found[person] = (int(day or 0), int(month or 0))
        return found

    async def budgets(self, people: Iterable[str]) -> dict[str, tuple[str | None, dict[str, int]]]:
        """Person: (role, {period: tokens} of their own budgets), for every person asked about."""
        roles = text("SELECT identifier, role FROM users WHERE identifier IN :people").bindparams(
            bindparam("people", expanding=True)
        )
        own = text("SELECT person, period, tokens FROM quotas WHERE person IN :people").bindparams(
            bindparam("people", expanding=True)
        )
        found: dict[str, tuple[str | None, dict[str, int]]] = {}
        async with self.engine.connect() as connection:
            for chunk in _chunks(people):
                role_of = dict((await connection.execute(roles, {"people": chunk})).all())
                periods: dict[str, dict[str, int]] = {}
                for person, period, tokens in await connection.execute(own, {"people": chunk}):
                    periods.setdefault(person, {})[period] = int(tokens)
                found.update({p: (role_of.get(p), periods.get(p, {})) for p in chunk})
        return found

    async def set_budget(self, person: str, period: str, tokens: int) -> None:
        """Give `person` a budget of their own for `period` (0 = unlimited)."""
        if period not in PERIODS or tokens < 0:
            raise ValueError(f"a budget is a period ({', '.join(PERIODS)}) and tokens >= 0")
        async with self.engine.begin() as connection:
            await connection.execute(
                text(
                    "INSERT INTO quotas (person, period, tokens, updated_at) VALUES (:p, :period, :t, :now) "
                    "ON CONFLICT (person, period) DO UPDATE SET tokens = excluded.tokens, "
                    "updated_at = excluded.updated_at"
                ),
                {"p": person, "period": period, "t": int(tokens), "now": _now()},
            )

    async def clear_budget(self, person: str) -> int:
        """Back to the role's budgets; how many own budgets were removed."""
        async with self.engine.begin() as connection:
            result = await connection.execute(text("DELETE FROM quotas WHERE person = :p"), {"p": person})
            return int(result.rowcount or 0)

    async def delete_oldest_day_before(self, cutoff: str) -> int:
        """Delete the rows of the oldest stored day if it is before `cutoff`: one day per call, so a
        backlog goes in small transactions. How many rows went."""
        async with self.engine.begin() as connection:
            oldest = (await connection.execute(text("SELECT MIN(day) FROM usage_days"))).scalar()
            if oldest is None or oldest >= cutoff:
                return 0
            result = await connection.execute(text("DELETE FROM usage_days WHERE day = :d"), {"d": oldest})
            return int(result.rowcount or 0)
