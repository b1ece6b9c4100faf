"""Operations settings: maintenance rounds, memory sampling and the leak alarm, ops routes."""

from __future__ import annotations

from dataclasses import dataclass

from services.config.fields import setting


@dataclass(frozen=True)
class ObservabilitySettings:
    """How often the service cleans up and measures itself, and who may read the numbers."""

    maintenance_interval_seconds: float = setting(
        30.0, "MAINTENANCE_INTERVAL_SECONDS", "Seconds between maintenance rounds (expire, gc, trim).", 1
    )
    memory_sample_seconds: float = setting(
        5.0, "MEMORY_SAMPLE_SECONDS", "Seconds between memory samples of the process tree.", 0.5
    )
    memory_samples_kept: int = setting(
        4320, "MEMORY_SAMPLES_KEPT", "Memory samples kept in the ring buffer (6 h at 5 s).", 10
    )
    leak_warmup_seconds: float = setting(
        300.0, "LEAK_WARMUP_SECONDS", "Start-up period left out of the leak slope.", 0
    )
    leak_window_seconds: float = setting(
        3600.0, "LEAK_WINDOW_SECONDS", "Sliding window of the leak slope.", 60
    )
    leak_alarm_mb_per_hour: float = setting(
        10.0, "LEAK_ALARM_MB_PER_HOUR", "Whole-tree memory growth that raises the leak alarm.", 0
    )
    latency_samples_kept: int = setting(
        10_000, "LATENCY_SAMPLES_KEPT", "Recent requests kept for /stats percentiles and plots.", 10
    )
    ops_token: str = setting(
        "",
        "OPS_TOKEN",
        "GET /status, /metrics, /stats and the detail of /healthz need `Authorization: Bearer <token>` "
        "(anonymous /healthz says only ok, overloaded or down, for load balancers). Required when the "
        "app is bound to an address other machines can reach (it refuses to start without); empty on "
        "loopback = those routes answer only local requests that no proxy forwarded.",
        tier="essential",
    )
    health_recent_output_seconds: float = setting(
        30.0,
        "HEALTH_RECENT_OUTPUT_SECONDS",
        "/healthz counts an engine that produced output this recently as answering, without a ping.",
        0,
    )
    health_ping_timeout_seconds: float = setting(
        15.0, "HEALTH_PING_TIMEOUT_SECONDS", "/healthz answers 503 when a one-token ping takes longer.", 0.1
    )
