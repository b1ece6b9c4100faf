"""Diagnostics: one switch for the memory probes of the app and of vLLM's processes.

DIAGNOSTICS picks a level; each level fixes what the probes do (the knobs the
probe code reads: `engine_memory_probe_*` and `app_memory_probe_*`, derived
here). What the probes write is read with
`python -m services.observability.attribution <DIAGNOSTICS_DIR>`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from services.config.fields import setting


class Probes(NamedTuple):
    """What the memory probes do at one DIAGNOSTICS level."""

    engine_seconds: float  # EngineCore and the worker: seconds between snapshots; 0 = on SIGUSR2 only
    engine_frames: int  # their tracemalloc frames, from the first snapshot on; 0 = no tracemalloc
    app_seconds: float  # the app: seconds between snapshots (a census, a pause of about a second)
    app_frames: int  # the app's tracemalloc frames; 0 = census only
    app_deep: bool  # each app census also walks every object reachable from module globals


DIAGNOSTIC_LEVELS: dict[str, Probes | None] = {
    "off": None,
    "counters": Probes(0.0, 0, 600.0, 0, False),
    "memory": Probes(0.0, 16, 600.0, 0, False),
    "all": Probes(600.0, 16, 600.0, 16, True),
}


@dataclass(frozen=True)
class DiagnosticSettings:
    """Probes for finding leaks: off in production, on for an attribution run."""

    diagnostics: str = setting(
        "off",
        "DIAGNOSTICS",
        "Memory probes for finding leaks, in the app and in vLLM's processes, writing to DIAGNOSTICS_DIR "
        "(read with `python -m services.observability.attribution <folder>`). off. counters: every 30 s "
        "each process appends a line of counters (allocator totals, Python's blocks, pymalloc's arenas, "
        "threads, anonymous memory) to `counters-<pid>.jsonl`; on SIGUSR2, and in the app every 600 s, "
        "it writes a census of its live objects (the app pauses about a second), and with `prof:true` in "
        "ENGINE_JEMALLOC_CONF vLLM's processes add jemalloc heap profiles. memory: as counters, and vLLM's "
        "processes trace Python allocations from their first SIGUSR2 on (tracemalloc, which slows the "
        "engine). all: as memory, plus tracemalloc in the app, censuses that walk every object reachable "
        "from module globals, and engine snapshots every 600 s; for attribution runs only (at 50 users "
        "the traced app fell behind).",
        tier="diagnostic",
    )
    diagnostics_dir: str = setting(
        "",
        "DIAGNOSTICS_DIR",
        "Folder the memory probes write to; empty = `diagnostics` under DATA_DIR.",
        tier="diagnostic",
    )

    @property
    def probes(self) -> Probes | None:
        """What DIAGNOSTICS asks of the probes (None: off)."""
        return DIAGNOSTIC_LEVELS[self.diagnostics]

    @property
    def diagnostics_folder(self) -> str:
        """DIAGNOSTICS_DIR, or `diagnostics` under DATA_DIR."""
        data_dir: str = getattr(self, "data_dir", ".")
        return self.diagnostics_dir or str(Path(data_dir) / "diagnostics")

    @property
    def engine_memory_probe_dir(self) -> str:
        """Where the probe in EngineCore and the worker writes; empty = off."""
        return self.diagnostics_folder if self.probes else ""

    @property
    def engine_memory_probe_seconds(self) -> float:
        return self.probes.engine_seconds if self.probes else 0.0

    @property
    def engine_memory_probe_frames(self) -> int:
        return self.probes.engine_frames if self.probes else 0

    @property
    def app_memory_probe_dir(self) -> str:
        """Where the probe in the app's own process writes; empty = off."""
        return self.diagnostics_folder if self.probes else ""

    @property
    def app_memory_probe_seconds(self) -> float:
        return self.probes.app_seconds if self.probes else 0.0

    @property
    def app_memory_probe_frames(self) -> int:
        return self.probes.app_frames if self.probes else 0

    @property
    def app_memory_probe_deep(self) -> bool:
        return self.probes.app_deep if self.probes else False
