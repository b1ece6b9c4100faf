"""Admission in /metrics: refusals by reason, requests running and waiting, and how the waits chat
turns were promised compare with what they got (services/admission/promises.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from services.admission.refusals import REASONS, SESSIONS_FULL
from services.admission.service import Admission


def admission_metrics(admission: Admission, sessions_refused: int) -> Iterator[Metric]:
    """Admission's gauges and counters: refusals by reason, running, waiting, waits promised and had."""
    line = admission.line
    refusals = CounterMetricFamily(
        "chat_admission_refusals",
        "Turns and requests refused at once (queue full, wait too long, engine queue full, per-user "
        "limits, sessions full), by reason.",
        labels=["reason"],
    )
    for reason in REASONS:
        refusals.add_metric([reason], sessions_refused if reason == SESSIONS_FULL else line.refusals[reason])
    yield refusals
    running = GaugeMetricFamily(
        "chat_admission_running", "Requests admitted to the engine, by kind.", labels=["kind"]
    )
    for kind, count in sorted(line.running.items()):
        running.add_metric([kind], count)
    yield running
    if line.enabled:
        yield GaugeMetricFamily(
            "chat_admission_running_limit", "Requests allowed to run at once (reading pace).", line.limit
        )
    yield GaugeMetricFamily("chat_admission_waiting", "Requests waiting in our queue.", len(line.waiting))
    yield CounterMetricFamily(
        "chat_admission_admitted", "Requests admitted to the engine.", line.admitted_total
    )
    yield CounterMetricFamily(
        "chat_admission_wait_seconds",
        "Seconds admitted requests waited in our queue, summed.",
        line.waited_seconds_total,
    )
    yield from promise_metrics(line.promises.status())


def promise_metrics(promises: dict[str, Any]) -> Iterator[Metric]:
    """Recent chat turns' promised and actual waits by quantile, and how late they ran."""
    for name, what in (("promised", "they were told"), ("actual", "to their first token")):
        waits = GaugeMetricFamily(
            f"chat_admission_{name}_wait_seconds",
            f"Chat turns of the last minute: their wait {what}, by quantile.",
            labels=["quantile"],
        )
        for q in (50, 95, 99):
            if (value := promises.get(f"{name}_p{q}")) is not None:
                waits.add_metric([f"0.{q}"], value)
        yield waits
    yield GaugeMetricFamily(
        "chat_admission_late_seconds",
        "How much later than promised recent chat turns got their first token (added to estimates).",
        promises["late_seconds"],
    )
