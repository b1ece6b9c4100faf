"""Usage's own health in /metrics: what waits to be written, what was written, dropped or failed."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from services.usage.ledger import UsageLedger


class UsageCollector(Collector):
    def __init__(self, ledger: UsageLedger) -> None:
        self._ledger = ledger

    def collect(self) -> Iterator[Metric]:
        ledger = self._ledger
        yield GaugeMetricFamily(
            "usage_pending_rows", "Rows of usage counted in memory, not written yet.", value=len(ledger.batch)
        )
        yield GaugeMetricFamily(
            "usage_people_cached",
            "People whose running totals are kept for budget checks.",
            value=len(ledger.running),
        )
        for name, doc, value in (
            ("usage_rows_written", "Rows of usage added to the database.", ledger.rows_written_total),
            (
                "usage_write_failures",
                "Failed writes of usage (kept for the next try).",
                ledger.write_failures_total,
            ),
            ("usage_dropped", "Counts dropped: USAGE_PENDING_ROWS was full.", ledger.batch.dropped),
            (
                "usage_retention_deleted",
                "Usage rows deleted by USAGE_RETENTION_DAYS.",
                ledger.retention_deleted_total,
            ),
        ):
            yield CounterMetricFamily(name, doc, value=value)
