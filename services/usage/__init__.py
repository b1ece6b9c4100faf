"""Usage per person per UTC day, kept in the database, and token budgets per day and month.

`UsageLedger` (ledger.py) is admission's accounting: it counts in memory, writes in batches and
checks budgets; `UsageStore` (store.py) reads and writes the tables, bounded; `usage_csv` and
`usage_table` (export.py) turn rows into text; `python -m services.usage` is the operators' command.
"""

from services.usage.export import usage_csv, usage_table
from services.usage.ledger import UsageLedger
from services.usage.store import UsageDay, UsageStore

__all__ = ["UsageDay", "UsageLedger", "UsageStore", "usage_csv", "usage_table"]
