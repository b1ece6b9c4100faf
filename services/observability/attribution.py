"""Which allocation sites grew inside vLLM's processes and the app: diffs of the memory probe's snapshots.

With DIAGNOSTICS on, the probe (services/memory/probe) writes tracemalloc snapshots,
and jemalloc heap profiles when jemalloc profiles, into DIAGNOSTICS_DIR, from
vLLM's processes and from the app (started there by app_probe.py). This
module pairs each process's first kept snapshot (or the first at or after a
label) with its newest and names the sites that grew, each with its share of
the growth:

    python -m services.observability.attribution DIR [--since LABEL] [--top 10]

Python allocations are grouped by traceback; native ones by the function
jeprof (libjemalloc-dev) attributes them to, with the sampling noise of the
difference (a net growth within it is not a finding).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shutil
import subprocess
import sys
import tracemalloc
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SNAPSHOT_NAME = re.compile(
    r"^(?P<role>[A-Za-z0-9_]+)-(?P<pid>\d+)-(?P<seq>\d+)-(?P<label>[^.]*)\.(?P<kind>tracemalloc|heap|census)$"
)
JEPROF_TIMEOUT_SECONDS = 600.0
HEAP_STACK_TOTAL = re.compile(r"^\s*t\*: (\d+): (\d+)")  # a stack's sampled objects and bytes, all threads
# Frames of the Python interpreter and libc that every native stack goes through: not a site.
INTERPRETER_FRAMES = (
    "Py",
    "_Py",
    "py",
    "cfunction",
    "method_vectorcall",
    "_start",
    "__libc",
    "main",
    "slot_tp",
    "vectorcall",
    "object_vacall",
    "builtin_",
    "func_",
    "partial_",
    "wrapper_",
    "call_",
    "start_thread",
    "clone",
    "t_bootstrap",
    "thread_run",
    "torch::autograd",
    "c10::BoxedKernel",
    "c10::impl",
    "torch::jit",
)


@dataclass(frozen=True)
class Snapshot:
    """One file written by the probe."""

    path: Path
    role: str
    pid: int
    sequence: int
    label: str
    kind: str


def find_snapshots(directory: Path) -> dict[tuple[str, int], list[Snapshot]]:
    """The probe's files by (role, pid), each list in the order they were taken."""
    found: dict[tuple[str, int], list[Snapshot]] = {}
    for path in sorted(directory.iterdir()):
        match = SNAPSHOT_NAME.match(path.name)
        if match:
            snap = Snapshot(
                path, match["role"], int(match["pid"]), int(match["seq"]), match["label"], match["kind"]
            )
            found.setdefault((snap.role, snap.pid), []).append(snap)
    for snaps in found.values():
        snaps.sort(key=lambda s: (s.sequence, s.kind))
    return found


def pick_pair(snaps: list[Snapshot], kind: str, since: str | None = None) -> tuple[Snapshot, Snapshot] | None:
    """(before, after) of one kind: the first at or after label `since` (or the first), and the newest."""
    of_kind = [s for s in snaps if s.kind == kind]
    if since is not None:
        later = [s for s in of_kind if s.label >= since]
        of_kind = later if len(later) >= 2 else of_kind
    return (of_kind[0], of_kind[-1]) if len(of_kind) >= 2 else None


def tracemalloc_growth(before: Path, after: Path, top: int = 10) -> dict[str, Any]:
    """Net growth of Python allocations between two snapshots and the tracebacks that grew most."""
    old, new = tracemalloc.Snapshot.load(str(before)), tracemalloc.Snapshot.load(str(after))
    differences = new.compare_to(old, "traceback")
    net = sum(d.size_diff for d in differences)
    sites = []
    for difference in sorted(differences, key=lambda d: d.size_diff, reverse=True)[:top]:
        if difference.size_diff <= 0:
            break
        frames = [f"{frame.filename}:{frame.lineno}" for frame in difference.traceback]
        sites.append(
            {
                "bytes": difference.size_diff,
                "blocks": difference.count_diff,
                "share_of_growth": round(difference.size_diff / net, 3) if net > 0 else None,
                "site": _short(frames[-1]) if frames else "?",
                "traceback": [_short(f) for f in reversed(frames)],
            }
        )
    return {"net_bytes": net, "sites": sites}


def census_growth(before: Path, after: Path, top: int = 10) -> dict[str, Any]:
    """Which types of live objects grew in number, and which long containers grew in length."""
    old, new = (json.loads(path.read_text()) for path in (before, after))
    types = []
    for name, (count, size) in new["types"].items():
        old_count, old_size = old["types"].get(name, (0, 0))
        types.append({"type": name, "objects": count - old_count, "bytes": size - old_size, "now": count})
    old_lengths = {(c["id"], c["type"]): c["length"] for c in old["containers"]}
    containers = [
        {
            **c,
            "grew_by": c["length"] - old_lengths.get((c["id"], c["type"]), 0),
            "new": (c["id"], c["type"]) not in old_lengths,
        }
        for c in new["containers"]
    ]
    old_paths, new_paths = old.get("reachable", {}), new.get("reachable", {})
    reachable = [
        {"path": path, "length": length, "grew_by": length - old_paths.get(path, 0)}
        for path, length in new_paths.items()
    ]
    return {
        "objects": sum(t["objects"] for t in types),
        "shallow_bytes": sum(t["bytes"] for t in types),
        "types": sorted(types, key=lambda t: -t["objects"])[:top],
        "containers": sorted(containers, key=lambda c: -c["grew_by"])[:top],
        "reachable": sorted(reachable, key=lambda c: -c["grew_by"])[:top],
        **(
            {"owners": owner_growth(old["owners"], new["owners"], top)}
            if "owners" in new and "owners" in old
            else {}
        ),
    }


def owner_growth(old: dict[str, Any], new: dict[str, Any], top: int) -> dict[str, Any]:
    """The deep census's diff: every reachable object's net change, and the module globals
    (owners) whose objects grew most in number, with the types that grew under each."""

    def total(owners: dict[str, Any], key: str) -> int:
        return sum(owner[key] for owner in owners.values())

    empty = {"objects": 0, "bytes": 0, "types": {}}
    grown = []
    for name, owner in new.items():
        before = old.get(name, empty)
        types = [
            {"type": kind, "objects": n - before["types"].get(kind, (0, 0))[0]}
            for kind, (n, _size) in owner["types"].items()
        ]
        grown.append(
            {
                "owner": name,
                "objects": owner["objects"] - before["objects"],
                "bytes": owner["bytes"] - before["bytes"],
                "now": owner["objects"],
                "types": [t for t in sorted(types, key=lambda t: -t["objects"])[:3] if t["objects"] > 0],
            }
        )
    return {
        "objects": total(new, "objects") - total(old, "objects"),
        "bytes": total(new, "bytes") - total(old, "bytes"),
        "grew": sorted(grown, key=lambda g: -g["objects"])[:top],
    }


def jemalloc_growth(before: Path, after: Path, top: int = 10, binary: str | None = None) -> dict[str, Any]:
    """Net growth of native allocations between two jemalloc profiles, by function (jeprof --text)."""
    jeprof = shutil.which("jeprof")
    if jeprof is None:
        return {"error": "jeprof not found (Debian package libjemalloc-dev)"}
    command = [jeprof, "--text", "--show_bytes", f"--base={before}", binary or sys.executable, str(after)]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=JEPROF_TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        return {"error": f"jeprof took longer than {JEPROF_TIMEOUT_SECONDS:.0f} s"}
    return (
        parse_jeprof_text(result.stdout, top)
        | {"sampling_noise_bytes": sampling_noise(before, after)}
        | ({"stderr": result.stderr[-500:]} if result.returncode else {})
    )


def read_heap_profile(path: Path) -> tuple[int, dict[str, tuple[int, int]]]:
    """A jemalloc heap_v2 profile's mean sampling interval in bytes and, for each stack, its
    sampled objects and their bytes (before jeprof scales them up)."""
    lines = path.read_text().splitlines()
    interval = int(lines[0].split("/")[1])
    stacks: dict[str, tuple[int, int]] = {}
    stack = None
    for line in lines[1:]:
        if line.startswith("@"):
            stack = line
        elif stack and (match := HEAP_STACK_TOTAL.match(line)):
            stacks[stack] = (int(match[1]), int(match[2]))
            stack = None
    return interval, stacks


def sampling_noise(before: Path, after: Path) -> int:
    """A lower bound, in bytes, on the standard deviation of the net growth jeprof reports
    between two profiles. jemalloc samples an allocation of s bytes with p = 1 - exp(-s/interval)
    and jeprof counts it as s/p, so each sampled object that came or went adds (1-p)(s/p)^2 to
    the variance; a stack whose count moved by k had at least k of them."""
    interval, old = read_heap_profile(before)
    _, new = read_heap_profile(after)
    variance = 0.0
    for stack in old.keys() | new.keys():
        (count0, bytes0), (count1, bytes1) = old.get(stack, (0, 0)), new.get(stack, (0, 0))
        if count0 != count1:
            size = (bytes0 + bytes1) / (count0 + count1)
            sampled = -math.expm1(-size / interval)
            variance += abs(count1 - count0) * (1 - sampled) * (size / sampled) ** 2
    return round(math.sqrt(variance))


def parse_jeprof_text(text: str, top: int = 10) -> dict[str, Any]:
    """The total, the top functions by flat bytes (where memory was allocated) and the native
    callers most of it went through (cumulative, interpreter frames left out), from
    `jeprof --text --show_bytes` output."""
    total = None
    rows: list[tuple[int, int, str]] = []
    for line in text.splitlines():
        if line.startswith("Total:"):
            total = int(line.split()[1])
            continue
        parts = line.split(None, 5)
        if len(parts) == 6 and parts[1].endswith("%"):
            rows.append((int(parts[0]), int(parts[3]), parts[5]))

    def share(value: int) -> float | None:
        return round(value / total, 3) if total else None

    sites = [
        {"bytes": flat, "share_of_growth": share(flat), "cumulative_bytes": cumulative, "site": name}
        for flat, cumulative, name in sorted(rows, key=lambda row: -row[0])[:top]
        if flat > 0
    ]
    callers = sorted(
        (row for row in rows if row[0] < row[1] and not row[2].startswith(INTERPRETER_FRAMES)),
        key=lambda row: -row[1],
    )[:top]
    through = [
        {"cumulative_bytes": cum, "share_of_growth": share(cum), "site": name} for _, cum, name in callers
    ]
    return {"net_bytes": total, "sites": sites, "through": through}


def attribute(directory: Path, since: str | None = None, top: int = 10) -> dict[str, Any]:
    """For every process that left two snapshots of a kind: what grew between them (Python
    allocations, live objects, native allocations)."""
    readers = (
        ("tracemalloc", "python", tracemalloc_growth),
        ("census", "objects", census_growth),
        ("heap", "native", jemalloc_growth),
    )
    report: dict[str, Any] = {}
    for (role, pid), snaps in find_snapshots(directory).items():
        entry: dict[str, Any] = {}
        for kind, key, growth in readers:
            if pair := pick_pair(snaps, kind, since):
                before, after = pair
                entry[key] = {"from": before.label, "to": after.label, **growth(before.path, after.path, top)}
        if entry:
            report[f"{role}-{pid}"] = entry
    return report


def _short(location: str) -> str:
    """A file path from site-packages (or the standard library) on, so reports stay readable."""
    for marker in ("site-packages/", "/lib/python3.11/"):
        if marker in location:
            return location.split(marker, 1)[1]
    return location


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("directory", type=Path, help="DIAGNOSTICS_DIR of the run")
    parser.add_argument(
        "--since", help="compare from the first snapshot with this label or later (e.g. r002000)"
    )
    parser.add_argument("--top", type=int, default=10)
    args = parser.parse_args(argv)
    print(json.dumps(attribute(args.directory, args.since, args.top), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
