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
    leak_alarm_mb_per_hour: float = setting(
        10.0, "LEAK_ALARM_MB_PER_HOUR", "Whole-tree memory growth that raises the leak alarm.", 0
    )
    ops_token: str = setting(
        "",
        "OPS_TOKEN",
        "GET /status, /metrics, /stats and the detail of the probes (/healthz, /readyz, /livez) need "
        "`Authorization: Bearer <token>` (anonymous probes say only their status word, for load "
        "balancers and Kubernetes). Required when the "
        "app is bound to an address other machines can reach (it refuses to start without); empty on "
        "loopback = those routes answer only local requests that no proxy forwarded.",
        tier="essential",
    )
    health_ping_timeout_seconds: float = setting(
        15.0, "HEALTH_PING_TIMEOUT_SECONDS", "/healthz answers 503 when a one-token ping takes longer.", 0.1
    )
