#!/usr/bin/env bash
# Set up (first time only), then ruff and the tests: real engine, real server, real browser.
#   scripts/test.sh          the per-commit tier: every test not marked `long` (what CI runs)
#   scripts/test.sh --long   the long tier: soaks, statistics over minutes, topologies, restarts,
#                            and the fuzz tests at ten times their per-commit budget
#   scripts/test.sh --all    both
# Further arguments go to pytest (e.g. -k engine, or a path). Tiers: tests/tiers.py.
set -euo pipefail
cd "$(dirname "$0")/.."

tier=(-m "not long")
profile=ci
case "${1:-}" in
  --long) tier=(-m "long or fuzz"); profile=long; shift ;;
  --all) tier=(); profile=long; shift ;;
esac
export HYPOTHESIS_PROFILE="${HYPOTHESIS_PROFILE:-$profile}"

scripts/setup.sh --test
.venv/bin/ruff check .
.venv/bin/ruff format --check .
exec .venv/bin/python -m pytest "${tier[@]}" "$@"
