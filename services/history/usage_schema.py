"""The tables of usage and quotas (services/usage): created by migrations 8 and 9.

`usage_days` holds one row of counters per person per UTC day ('YYYY-MM-DD', so text order is time
order), added to by UPSERT from every replica; `quotas` holds the budgets an administrator gave one
person (tokens per day or month, 0 = unlimited), which replace their role's default.
"""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

USAGE_COUNTERS = ("prompt_tokens", "answer_tokens", "turns", "documents", "api_calls", "refusals")


async def usage_days_table(connection: AsyncConnection) -> None:
    counters = ", ".join(f"{name} BIGINT NOT NULL DEFAULT 0" for name in USAGE_COUNTERS)
    await connection.execute(
        text(
            f"CREATE TABLE IF NOT EXISTS usage_days (person TEXT NOT NULL, day TEXT NOT NULL, {counters}, "
            "updated_at TEXT NOT NULL, PRIMARY KEY (person, day))"
        )
    )
    await connection.execute(text("CREATE INDEX IF NOT EXISTS usage_days_day ON usage_days (day)"))


async def quotas_table(connection: AsyncConnection) -> None:
    await connection.execute(
        text(
            "CREATE TABLE IF NOT EXISTS quotas (person TEXT NOT NULL, period TEXT NOT NULL, "
            "tokens BIGINT NOT NULL, updated_at TEXT NOT NULL, PRIMARY KEY (person, period))"
        )
    )
