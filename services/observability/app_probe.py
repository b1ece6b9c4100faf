"""The memory probe inside the app's own process, and anonymous memory by kind of mapping.

DIAGNOSTICS turns it on (services/runtime.py): the same probe as in
vLLM's processes (services/memory/probe), under role `app`, its counters with
the app's anonymous memory split by kind of mapping. attribution.py reads what
it writes.
"""

from __future__ import annotations

import os
from pathlib import Path


def start_app_probe(
    directory: str, interval_seconds: float, tracemalloc_frames: int, deep_census: bool = False
) -> None:
    """Run the probe in this process too (role `app`), its counters with anonymous memory by mapping."""
    from services.memory import start_probe

    Path(directory).mkdir(parents=True, exist_ok=True)

    def by_mapping() -> dict[str, float]:
        return {f"anonymous_bytes.{kind}": size for kind, size in mapping_categories(os.getpid()).items()}

    start_probe(
        str(Path(directory).resolve()),
        interval_seconds or None,
        "app",
        by_mapping,
        tracemalloc_frames,
        deep_census,
    )


def mapping_categories(pid: int) -> dict[str, int]:
    """Anonymous resident bytes of a process by kind of mapping (from /proc/<pid>/smaps).

    Where memory that neither tracemalloc nor a heap profile sees lives: glibc's
    brk heap, JIT-compiled code (executable anonymous mappings, e.g. oneDNN
    kernels), thread stacks, and anonymous mmaps by size (malloc arenas are 64 MB,
    pymalloc arenas 1 MB, large blocks their own size).
    """
    found: dict[str, int] = {}
    kind = None
    try:
        with open(f"/proc/{pid}/smaps", encoding="ascii", errors="replace") as smaps:
            for line in smaps:
                head = line.split(None, 5)
                if "-" in head[0] and len(head) >= 5 and not head[0].endswith(":"):
                    kind = _mapping_kind(head)
                elif head[0] == "Anonymous:" and kind is not None:
                    found[kind] = found.get(kind, 0) + int(head[1]) * 1024
    except OSError:
        return {}
    return found


def _mapping_kind(head: list[str]) -> str:
    start, end = (int(part, 16) for part in head[0].split("-"))
    name = head[5].strip() if len(head) > 5 else ""
    if name in ("[heap]", "[stack]"):
        return name.strip("[]")
    if name and not name.startswith("["):
        return "file-backed"
    if "x" in head[1]:
        return "anon-exec"
    size = end - start
    return "anon<1MB" if size < 2**20 else "anon<64MB" if size < 2**26 else "anon>=64MB"
