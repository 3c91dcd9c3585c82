#!/usr/bin/env bash
# Set up .venv and run the whole test suite (PostgreSQL + Redis on 127.0.0.1 by default;
# SLUICE_TEST_DATABASE_URL=sqlite runs it on SQLite).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# One torch/OpenMP thread per process: the two test processes start with their LoRA
# trainings and SmolLM2 engines side by side, and torch's default (a thread per core) put
# 2 x 2 spinning threads on 2 cores. Measured on a 2-core box, clean clone, same HEAD:
# 23:22 -> 18:13 of tests, user CPU 2,014 -> 1,427 s, the three trainings' tests
# 348/299/197 -> 227/97/80 s. Set OMP_NUM_THREADS to override.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
# Two processes, each with its own database, Redis namespace and servers; a file's tests
# stay together on one (its module fixtures start once). Half the suite's time is spent
# waiting on subprocesses, so two take 22.5 min down to 17-18 on a 2-core box.
# SLUICE_TEST_WORKERS=0 runs it in this one process.
exec .venv/bin/python -m pytest -n "${SLUICE_TEST_WORKERS:-2}" --dist loadfile --no-loadscope-reorder \
    --durations=25 "$@"
