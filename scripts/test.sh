#!/usr/bin/env bash
# Set up (first time only) and run the whole test suite: real engine, real
# server, real browser. Extra arguments go to pytest (e.g. -k engine).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --test
.venv/bin/ruff check .
.venv/bin/ruff format --check .
exec .venv/bin/python -m pytest "$@"
