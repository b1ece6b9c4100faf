"""Usage counted in memory between writes: one row of counters per (person, day), bounded.

Counting is a dict update in the event loop; the flush task takes the rows and adds them to the
database in one statement. While the database is down the rows are put back and added to, never
more than `max_rows` of them: past that, usage of rows not already held is dropped and counted.
"""

from __future__ import annotations

from collections.abc import Iterable

from services.history.usage_schema import USAGE_COUNTERS as COUNTERS  # the table's columns, in order

Key = tuple[str, str]  # (person, day)


class UsageBatch:
    """Rows of counters waiting to be added to the database."""

    def __init__(self, max_rows: int) -> None:
        self.max_rows = max_rows
        self.rows: dict[Key, list[int]] = {}
        self.dropped = 0  # counts (not rows) lost to the bound

    def __len__(self) -> int:
        return len(self.rows)

    def add(self, person: str, day: str, **counts: int) -> bool:
        """Add `counts` (names from COUNTERS) to the row of (person, day); False when dropped."""
        values = [max(0, int(counts.get(name, 0))) for name in COUNTERS]
        unknown = set(counts) - set(COUNTERS)
        if unknown:
            raise ValueError(f"unknown usage counters: {sorted(unknown)}")
        return self._merge((person, day), values)

    def _merge(self, key: Key, values: list[int]) -> bool:
        row = self.rows.get(key)
        if row is None:
            if len(self.rows) >= self.max_rows:
                self.dropped += sum(values)
                return False
            self.rows[key] = list(values)
            return True
        for index, value in enumerate(values):
            row[index] += value
        return True

    def take(self) -> dict[Key, list[int]]:
        """Every row, leaving the batch empty (the flush owns them now)."""
        rows, self.rows = self.rows, {}
        return rows

    def put_back(self, rows: dict[Key, list[int]]) -> None:
        """Rows whose write failed: added back (to what was counted meanwhile), within the bound."""
        for key, values in rows.items():
            self._merge(key, values)

    def tokens(self, person: str, days: Iterable[str]) -> int:
        """Prompt + answer tokens of `person` on `days` still waiting here."""
        total = 0
        for day in days:
            row = self.rows.get((person, day))
            if row is not None:
                total += row[0] + row[1]
        return total
