"""The API's Prometheus metrics, labelled by route (next to services/observability/metrics.py's chat_*).

vLLM's own `vllm:*` metrics count every engine request, chat and API alike; these add what only the
gate sees: who was refused and why (status), time to the first response chunk (for a stream: the
first token) and the whole request, per route.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/models", "other")
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


def route_label(path: str) -> str:
    """One of ROUTES (a bounded label set, whatever paths callers try)."""
    return path if path in ROUTES else "other"


class ApiMetrics:
    """api_requests_total{route,status}, api_requests_in_flight{route}, latency histograms{route}."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "api_requests",
            "API requests answered, by route and HTTP status.",
            ["route", "status"],
            registry=registry,
        )
        self.in_flight = Gauge(
            "api_requests_in_flight", "API requests being served.", ["route"], registry=registry
        )
        self.first_chunk = Histogram(
            "api_first_chunk_seconds",
            "Seconds from an API request's arrival to its first response bytes (a stream's first token).",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.duration = Histogram(
            "api_request_seconds",
            "Seconds from an API request's arrival to its last byte.",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
