#!/usr/bin/env bash
# Set up (first time only) and start the app on http://127.0.0.1:8000.
# Extra arguments go to `chainlit run` (e.g. --port 9000).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# services.web.launch preloads the app's malloc (APP_ALLOCATOR), then runs `chainlit run`.
exec .venv/bin/python -m services.web.launch app.py --headless --host "${HOST:-127.0.0.1}" --port "${PORT:-8000}" "$@"
