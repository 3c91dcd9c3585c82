"""Node-side pool driving, run by the Celery tasks on queue ``pool.<node>``: engine
processes, health, the supervisor, metrics scraping and LoRA fan-out. Every state change
is committed, then published in the gateway snapshot so routing follows at once.

Per-replica supervisor memory (consecutive failures, next restart time, start time) is a
small Redis hash ``<ns>:replica:<id>:supervisor``; a Redis lock per replica keeps two
tasks from starting the same replica.
"""
from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from pathlib import Path

from flask import current_app

from app.catalog.models import Pool, Replica, ReplicaMetric
from app.contract.secrets import POOL_ENGINE_SECRET, pool_engine_key
from app.extensions import db
from app.models_base import utcnow
from app.pools import states
from app.snapshot.service import publish_after_commit
from workers.pools import health, launcher
from workers.pools import lora as lora_calls
from workers.pools import metrics as scrape
from workers.pools.vllm_cmd import build_command, kv_event_endpoints, replica_port

log = logging.getLogger(__name__)



def _var_dir() -> Path:
    return Path(current_app.config["POOLS_VAR_DIR"] or launcher.ROOT / "var")


def _paths(replica: Replica) -> launcher.ReplicaPaths:
    return launcher.replica_paths(_var_dir(), replica.name)


def recorded_pid(replica: Replica) -> int | None:
    """The engine pid the replica's pid file records (it may have outlived its DB row's
    pid: a worker killed between the commit and the stop)."""
    return launcher.read_pid(_paths(replica))


def _alive(replica: Replica, pid: int | None = None) -> bool:
    """Whether the replica's engine (``pid``, else the recorded one) is still the process
    its pid file recorded (pid and start time)."""
    pid = replica.pid if pid is None else pid
    return launcher.is_running(pid, replica_port(replica.pool.to_dict(), replica.index),
                               start=launcher.recorded_start(_paths(replica), pid))


def _redis():
    from app.redis_client import get_redis, keys
    return get_redis(), keys()


def _memory_key(replica_id: int) -> str:
    return _redis()[1].replica_supervisor(replica_id)


def _memory(replica_id: int) -> dict[str, float]:
    raw = _redis()[0].hgetall(_memory_key(replica_id))
    return {k.decode(): float(v) for k, v in raw.items()}


def _remember(replica_id: int, **fields: float) -> None:
    _redis()[0].hset(_memory_key(replica_id), mapping={k: f"{v}" for k, v in fields.items()})


@contextmanager
def _replica_lock(replica_id: int, blocking_s: float = 30.0):
    r, k = _redis()
    lock = r.lock(k.replica_lock(replica_id), timeout=120, blocking_timeout=blocking_s)
    got = lock.acquire()
    try:
        yield got
    finally:
        if got:
            try:
                lock.release()
            except Exception:  # noqa: BLE001 - expired lock: nothing to release
                pass


def _set_state(replica: Replica, event: str, error: str | None = None) -> None:
    replica.state = states.next_state(event, replica.state)
    if error is not None:
        replica.last_error = error[:500]


def _commit_and_publish() -> None:
    db.session.commit()
    publish_after_commit()


def _spawn(replica: Replica) -> None:
    pool = replica.pool
    # Bind/advertise hosts: loopback for a single-node setup; a GPU node sets its address.
    host = current_app.config["POOLS_BIND_HOST"]
    argv, env = build_command(pool.to_dict(), replica.index, host=host)
    key = pool_engine_key(pool.id)
    if key:
        env["VLLM_API_KEY"] = key   # vLLM's --api-key, from the environment (not in argv/ps)
    elif host not in ("127.0.0.1", "localhost", "::1"):
        raise ValueError(f"an engine listening on {host} needs a key: set "
                         f"{POOL_ENGINE_SECRET} on the node workers and the gateways")
    paths = _paths(replica)
    port = replica_port(pool.to_dict(), replica.index)
    # an engine an earlier start left behind (its supervisor died before stopping it) is
    # reaped by its recorded pid and start time, never by name
    launcher.reap(paths)
    replica.pid = launcher.spawn(argv, env, paths)
    replica.url = f"http://{current_app.config['POOLS_ADVERTISE_HOST']}:{port}"
    _remember(replica.id, started_at=time.time())


def start_replica(replica_id: int, *, wait_s: float | None = None) -> str:
    """Spawn the engine (state ``starting``), then wait for /health up to ``wait_s`` and
    mark it ``healthy``; the supervisor finishes the job if the wait runs out."""
    with _replica_lock(replica_id) as got:
        if not got:
            return "busy"
        replica = db.session.get(Replica, replica_id)
        if replica is None:
            return "gone"
        if replica.state in ("starting", "healthy") and _alive(replica):
            return replica.state
        if replica.state == "draining":
            return replica.state
        if replica.state in ("starting", "healthy"):  # its process is gone
            _set_state(replica, "down", "process not running")
        _set_state(replica, "start", "")
        try:
            _spawn(replica)
        except Exception as exc:  # noqa: BLE001 - recorded on the replica
            _set_state(replica, "down", f"spawn failed: {exc}")
            _commit_and_publish()
            return "down"
        _commit_and_publish()
        url, pid = replica.url, replica.pid
        start = launcher.recorded_start(_paths(replica), pid)
    wait = float(current_app.config["POOLS_START_WAIT_S"] if wait_s is None else wait_s)
    ok, detail = health.wait_healthy(url, wait,
                                     alive=lambda: launcher.is_running(pid, start=start))
    db.session.expire_all()
    if ok:
        return _mark_healthy(replica_id)
    log.info("replica %s not healthy yet: %s", replica_id, detail)
    if health.is_broken(detail) or not launcher.is_running(pid, start=start):
        return supervise_replica(replica_id)  # down now, restarted with backoff later
    return "starting"


def _restore_adapters(replica: Replica) -> None:
    """A (re)started engine holds no LoRA adapter: load the pool's adapters on it before
    it is marked healthy (a failure is written on the adapter; the replica serves the
    base model and gets none of that adapter's traffic)."""
    from app.adapters.node import restore_on_replica
    try:
        restored = restore_on_replica(replica.pool_id, replica.id, replica.url)
    except Exception:  # noqa: BLE001 - the base model still serves
        log.exception("replica %s: restoring its adapters failed", replica.id)
        return
    if restored:
        log.info("replica %s: adapters restored %s", replica.id, restored)


def _mark_healthy(replica_id: int) -> str:
    with _replica_lock(replica_id) as got:
        replica = db.session.get(Replica, replica_id)
        if not got or replica is None or replica.state != "starting":
            return replica.state if replica else "gone"
        _restore_adapters(replica)
        _set_state(replica, "healthy", "")
        replica.last_health_at = utcnow()
        _remember(replica_id, failures=0, health_failures=0)
        _commit_and_publish()
        return "healthy"


def stop_replica(replica_id: int) -> str:
    """Mark ``stopped`` first (the gateway stops sending), then end the process."""
    with _replica_lock(replica_id) as got:
        replica = db.session.get(Replica, replica_id)
        if replica is None:
            return "gone"
        pid, port = replica.pid, replica_port(replica.pool.to_dict(), replica.index)
        paths = _paths(replica)
        _set_state(replica, "stop")
        replica.pid = None
        _commit_and_publish()
        grace = float(current_app.config["POOLS_STOP_GRACE_S"])
        start = launcher.recorded_start(paths, pid)
        if pid and (start is not None or launcher.is_running(pid, port)):
            launcher.terminate(pid, grace_s=grace, start=start)
        launcher.reap(paths, grace_s=grace)   # whatever the pid file names, if still it
        return "stopped" if got else "stopped (unlocked)"


def drain_replica(replica_id: int, *, timeout_s: float | None = None) -> str:
    """``draining`` (no new requests routed), wait until the engine reports nothing
    running or waiting (bounded), then stop."""
    replica = db.session.get(Replica, replica_id)
    if replica is None:
        return "gone"
    if states.can("drain", replica.state):
        _set_state(replica, "drain")
        _commit_and_publish()
    url = replica.url
    deadline = time.monotonic() + float(current_app.config["POOLS_DRAIN_TIMEOUT_S"]
                                        if timeout_s is None else timeout_s)
    while time.monotonic() < deadline:
        try:
            stats = scrape.live_stats(scrape.parse_prometheus(health.fetch_metrics(url)))
        except Exception:  # noqa: BLE001 - engine gone: nothing left to drain
            break
        if stats["num_requests_running"] + stats["num_requests_waiting"] == 0:
            break
        time.sleep(0.5)
    return stop_replica(replica_id)


def restart_replica(replica_id: int) -> str:
    stop_replica(replica_id)
    return start_replica(replica_id)


def _node_replicas(node: str, wanted: frozenset[str]) -> list[Replica]:
    return list(db.session.scalars(
        db.select(Replica).join(Pool).where(Pool.node == node, Replica.state.in_(wanted))
        .order_by(Replica.id)))


def kv_event_sources(node: str) -> list[dict]:
    """The node's healthy replicas whose pool publishes KV events, with the endpoints a
    subscriber connects to (``{"id", "endpoint", "replay", "topic"}``)."""
    from urllib.parse import urlparse
    out = []
    for replica in _node_replicas(node, frozenset({"healthy"})):
        pool = replica.pool.to_dict()
        ends = kv_event_endpoints(pool, replica.index,
                                 urlparse(replica.url or "").hostname or "127.0.0.1")
        if ends:
            out.append({"id": replica.id, **ends})
    return out


def kv_index_node(node: str) -> str:
    """One tick of the node's KV-event subscriber supervision (``pools.kv_index``)."""
    from workers.pools.kv_subscriber import ensure_running
    r, keys = _redis()
    return ensure_running(r, keys, node, kv_event_sources(node))


def _backoff_s(failures: float) -> float:
    base = float(current_app.config["POOLS_BACKOFF_BASE_S"])
    return min(float(current_app.config["POOLS_BACKOFF_MAX_S"]), base * (2 ** int(failures)))


def supervise_node(node: str) -> dict[int, str]:
    """One supervisor pass over this node's replicas; returns what it did per replica."""
    done: dict[int, str] = {}
    for replica in _node_replicas(node, states.SUPERVISED):
        with _replica_lock(replica.id, blocking_s=0.5) as got:
            if not got:
                continue
            db.session.refresh(replica)
            done[replica.id] = _supervise_one(replica)
    return done


def supervise_replica(replica_id: int) -> str:
    with _replica_lock(replica_id) as got:
        replica = db.session.get(Replica, replica_id)
        if not got or replica is None or replica.state not in states.SUPERVISED:
            return replica.state if replica else "gone"
        return _supervise_one(replica)


def _supervise_one(replica: Replica) -> str:
    now = time.time()
    mem = _memory(replica.id)
    if replica.state == "down":
        if now < mem.get("next_restart", 0):
            return "waiting"
        replica.restarts += 1
        _set_state(replica, "start")
        try:
            _spawn(replica)
        except Exception as exc:  # noqa: BLE001
            _fail(replica, mem, f"spawn failed: {exc}")
            return "down"
        _commit_and_publish()
        return "restarted"
    if not _alive(replica):
        tail = launcher.log_tail(_paths(replica), 200).strip().splitlines()[-1:] or [""]
        _fail(replica, mem, f"process {replica.pid} exited; last log: {tail[0]}")
        return "down"
    ok, detail = health.check(replica.url)
    if ok:
        replica.last_health_at = utcnow()
        if replica.state == "starting":
            _restore_adapters(replica)
            _set_state(replica, "healthy", "")
            _remember(replica.id, failures=0, health_failures=0)
            _commit_and_publish()
            return "healthy"
        if mem.get("health_failures"):
            _remember(replica.id, health_failures=0)
        db.session.commit()
        return "ok"
    if replica.state == "starting":
        if health.is_broken(detail) or now - mem.get("started_at", now) > float(
                current_app.config["POOLS_START_TIMEOUT_S"]):
            _stop_engine(replica)
            _fail(replica, mem, f"not healthy in time: {detail}")
            return "down"
        return "starting"
    fails = mem.get("health_failures", 0) + 1
    _remember(replica.id, health_failures=fails)
    if fails >= int(current_app.config["POOLS_HEALTH_FAILURES"]):
        _stop_engine(replica)
        _fail(replica, mem, f"unhealthy: {detail}")
        return "down"
    return "unhealthy"


def _stop_engine(replica: Replica) -> None:
    if _alive(replica):
        launcher.terminate(replica.pid, grace_s=float(current_app.config["POOLS_STOP_GRACE_S"]),
                           start=launcher.recorded_start(_paths(replica), replica.pid))


def _fail(replica: Replica, mem: dict[str, float], error: str) -> None:
    failures = mem.get("failures", 0)
    _remember(replica.id, failures=failures + 1, health_failures=0,
              next_restart=time.time() + _backoff_s(failures))
    if replica.state != "down":
        _set_state(replica, "down", error)
    else:
        replica.last_error = error[:500]
    replica.pid = None
    _commit_and_publish()


def scrape_node(node: str) -> int:
    """Scrape /metrics of this node's serving replicas into Redis (live, with a TTL) and
    one ReplicaMetric row each; returns how many were scraped."""
    r, k = _redis()
    ttl = int(current_app.config["POOLS_STATS_TTL_S"])
    count = 0
    for replica in _node_replicas(node, frozenset({"healthy", "draining"})):
        try:
            text = health.fetch_metrics(replica.url)
        except Exception as exc:  # noqa: BLE001 - the supervisor deals with dead replicas
            log.info("scrape of replica %s failed: %s", replica.id, exc)
            continue
        stats = scrape.live_stats(scrape.parse_prometheus(text))
        scrape.store_live(r, k, replica.id, stats, ttl_s=ttl, at=time.time())
        db.session.add(ReplicaMetric(replica_id=replica.id, **scrape.metric_row_values(stats)))
        count += 1
    _prune_metrics()
    db.session.commit()
    return count


def _prune_metrics() -> None:
    """Keep ``POOLS_METRICS_RETENTION_H`` hours of scrapes (the console shows the latest)."""
    from datetime import timedelta
    cutoff = utcnow() - timedelta(hours=float(current_app.config["POOLS_METRICS_RETENTION_H"]))
    db.session.execute(db.delete(ReplicaMetric).where(ReplicaMetric.at < cutoff))


def _serving(pool_id: int) -> list[tuple[int, str]]:
    return [(r.id, r.url) for r in db.session.scalars(
        db.select(Replica).where(Replica.pool_id == pool_id,
                                 Replica.state.in_(("healthy", "starting"))))]


def load_lora(pool_id: int, lora_name: str, lora_path: str) -> dict[int, dict]:
    """Hot-load on every serving replica of the pool; per-replica results."""
    return lora_calls.load_everywhere(_serving(pool_id), lora_name, lora_path,
                                      api_key=pool_engine_key(pool_id))


def unload_lora(pool_id: int, lora_name: str) -> dict[int, dict]:
    return lora_calls.unload_everywhere(_serving(pool_id), lora_name,
                                        api_key=pool_engine_key(pool_id))
