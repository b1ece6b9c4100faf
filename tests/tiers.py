"""The suite's tiers: markers set from what a test uses, Hypothesis profiles, and a count of the
vLLM engines a run started.

`scripts/test.sh` runs every test not marked `long` (the per-commit tier, what CI runs);
`scripts/test.sh --long` runs the `long` tests and the fuzz tests at the long profile's budget;
`scripts/test.sh --all` runs everything. Markers (pyproject.toml lists them):

- `engine`: needs a model, so an engine or a server (set here from the model fixtures);
- `default_model`: on the default model (set from `default_server`);
- `browser`: drives Chromium (tests/system/browser/, the `page` fixture, or marked by hand);
- `postgres`, `ldap`: start a throwaway PostgreSQL cluster or slapd;
- `fuzz`: Hypothesis tests; their example counts come from the profile, never from the test;
- `topology`: several processes standing for a deployment (replicas, routers, balancers); long;
- `long`: a rate, slope, percentile or ratio over minutes, a soak, a restart, a topology: each
  has a smoke in the per-commit tier that checks the same "nothing left behind" facts.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import psutil
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.database import DirectoryBasedExampleDatabase

# Marker set on every test that uses one of these fixtures (directly or through others).
MARK_BY_FIXTURE = {
    "tiny_model_dir": "engine",
    "default_model_dir": "engine",
    "default_server": "default_model",
    "page": "browser",
    "postgres": "postgres",
    "slapd": "ldap",
}
CI_EXAMPLES = 20  # drawn per Hypothesis test per run, besides every pinned @example
LONG_EXAMPLES = CI_EXAMPLES * 10


def register_hypothesis_profiles(examples_folder: Path) -> None:
    """`ci` (the default): the same small draw every run, nothing stored; `long`
    (HYPOTHESIS_PROFILE=long, what `scripts/test.sh --long` sets): 10x, random, and the examples
    that failed kept in `examples_folder` so the next run tries them first."""
    common = {"deadline": None, "print_blob": False, "suppress_health_check": [HealthCheck.too_slow]}
    settings.register_profile("ci", max_examples=CI_EXAMPLES, derandomize=True, database=None, **common)
    settings.register_profile(
        "long",
        max_examples=LONG_EXAMPLES,
        database=DirectoryBasedExampleDatabase(str(examples_folder)),
        **common,
    )
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def mark_tiers(items: list[pytest.Item]) -> None:
    """Add the markers a test's fixtures, folder and kind imply (module docstring)."""
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        for fixture, marker in MARK_BY_FIXTURE.items():
            if fixture in used:
                item.add_marker(marker)
        if "/browser/" in item.nodeid:
            item.add_marker("browser")
        if getattr(getattr(item, "obj", None), "is_hypothesis_test", False):
            item.add_marker("fuzz")
        if item.get_closest_marker("topology"):
            item.add_marker("long")


class EngineCensus:
    """Counts the vLLM engines this test session started, wherever they run (in this process, under
    an app server, as `vllm serve`): every engine start spawns one EngineCore process, which a
    thread here sees among this process's descendants (an engine lives far longer than a poll)."""

    def __init__(self, interval_seconds: float = 0.5) -> None:
        self.interval_seconds = interval_seconds
        self.seen: set[tuple[int, float]] = set()  # (pid, create time): pids are reused
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="engine-census", daemon=True)

    def start(self) -> EngineCensus:
        self._thread.start()
        return self

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(timeout=5)
        return len(self.seen)

    def _watch(self) -> None:
        me = psutil.Process()
        while not self._stop.wait(self.interval_seconds):
            try:
                descendants = me.children(recursive=True)
            except psutil.Error:
                continue
            for process in descendants:
                try:
                    if process.name().startswith("VLLM::EngineCor"):
                        self.seen.add((process.pid, process.create_time()))
                except psutil.Error:
                    pass
