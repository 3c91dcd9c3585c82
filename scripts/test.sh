#!/usr/bin/env bash
# Set up .venv and run the whole test suite (PostgreSQL + Redis on 127.0.0.1 by default;
# SLUICE_TEST_DATABASE_URL=sqlite runs it on SQLite).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec .venv/bin/python -m pytest "$@"
