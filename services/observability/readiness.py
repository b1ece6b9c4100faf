"""Three questions about a replica, asked by three routes (as Kubernetes' probes ask them):

- /readyz, "can this replica serve pages": started, not stopping, its database reachable or its
  fallback at work (chat unsaved, limits counted per replica, a probe retrying). It never asks the
  engine: with the engine tier down a balancer keeps every replica, and people get sign-in, their
  history and the app's own "the model is not available" instead of the balancer's bare 503;
- /livez, "would a restart help": the event loop answers and an in-process engine's processes run
  (remote servers never count: restarting the app does not bring them back);
- /healthz, "does the engine answer" (status.py), whose detail says how many model servers answer
  (all, some or none) and whether the database is shared.

The pure rules are here; ServiceStatus reads the parts and /metrics exports the same as gauges.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric

from services.admission.shared_limits import SharedLimits
from services.engine.backends.remote import RemoteLLM
from services.engine.backends.remote.model_view import RemoteModel
from services.history.database import sqlite_path
from services.history.service import History

ALL, SOME, NONE, UNKNOWN = "all", "some", "none", "unknown"
# History.database_state values a replica serves pages with: "fallback" is chat going on unsaved.
SERVING_DATABASE_STATES = ("none", "reachable", "fallback")
DATABASE_STATES = (*SERVING_DATABASE_STATES, "lost")


def servers_state(answering: int, known: int) -> str:
    """Whether all, some or none of `known` model servers answer ("all", "some", "none")."""
    if answering <= 0 or known <= 0:
        return NONE
    return ALL if answering >= known else SOME


@dataclass(frozen=True)
class EngineTier:
    """The model servers as the last health check saw them (an in-process engine is one server)."""

    remote: bool
    answering: int
    known: int
    checked_seconds_ago: float | None  # None: not checked yet

    @property
    def state(self) -> str:
        return UNKNOWN if self.checked_seconds_ago is None else servers_state(self.answering, self.known)

    def detail(self) -> dict[str, Any]:
        seconds = self.checked_seconds_ago
        return {
            "state": self.state,
            "answering": self.answering,
            "known": self.known,
            "remote": self.remote,
            "checked_seconds_ago": None if seconds is None else round(seconds, 1),
        }


def engine_tier(backend: object, alive: bool, now: float) -> EngineTier:
    """The tier behind `backend` (monotonic `now`): RemoteLLM's last check of its servers (behind a
    router, the router's servers), or the in-process engine, answering while `alive`."""
    remote = backend.remote if isinstance(backend, RemoteModel) else backend
    if not isinstance(remote, RemoteLLM):
        return EngineTier(False, int(alive), 1, 0.0)
    if remote.servers_answering is None or remote.servers_checked_at is None:
        return EngineTier(True, 0, len(remote.servers), None)
    answering, known = remote.servers_answering
    return EngineTier(True, answering, known, now - remote.servers_checked_at)


def database_detail(history: History | None, shared: SharedLimits | None) -> dict[str, Any]:
    """The database as this replica uses it: its kind, its state (History.database_state), and whether
    the per-person limits are counted in it for every replica right now (`shared`)."""
    if history is None or history.engine is None:
        return {"kind": "none", "state": "none", "shared": False}
    return {
        "kind": "sqlite" if sqlite_path(history.settings) else "postgresql",
        "state": history.database_state,
        "shared": shared is not None and not shared.database.failing,
    }


def readiness(started: bool, draining: bool, database_state: str) -> tuple[bool, dict[str, Any]]:
    """(ready, detail) for /readyz: started (the settings were read and checked before that), not
    stopping, and the database reachable, absent, or down with its fallback at work."""
    ready = started and not draining and database_state in SERVING_DATABASE_STATES
    detail = {"started": started, "draining": draining, "database": database_state}
    return ready, {"status": "ready" if ready else "not ready", **detail}


def liveness(engine_alive: bool, processes_running: bool) -> tuple[bool, dict[str, Any]]:
    """(alive, detail) for /livez: an in-process engine that died takes the replica with it (a restart
    starts a new one); remote servers are never asked."""
    if engine_alive and processes_running:
        return True, {"status": "alive"}
    return False, {"status": "dead", "error": "the engine process is not running"}


def readiness_metrics(ready: bool, tier: dict[str, Any] | None) -> Iterator[Metric]:
    """/readyz as `chat_ready`, and, while serving, the engine tier and the database as /healthz's
    detail last saw them (`tier`: ServiceStatus.tier_detail)."""
    yield GaugeMetricFamily(
        "chat_ready", "1 while /readyz says this replica can serve pages.", value=int(ready)
    )
    if tier is None:
        return
    servers, database = tier["engine_servers"], tier["database"]
    for name, doc, value in (
        (
            "chat_engine_servers_answering",
            "Model servers that answered the last health check (an in-process engine: 1 while alive).",
            servers["answering"],
        ),
        (
            "chat_engine_servers_known",
            "Model servers known at the last health check (behind a router: the ones it lists).",
            servers["known"],
        ),
        (
            "chat_database_shared",
            "1 while per-person limits are counted in the database for every replica (not each alone).",
            int(database["shared"]),
        ),
    ):
        yield GaugeMetricFamily(name, doc, value=value)
    state = GaugeMetricFamily(
        "chat_database_state", "1 for the database's state as this replica sees it.", labels=["state"]
    )
    for name in DATABASE_STATES:
        state.add_metric([name], int(database["state"] == name))
    yield state
