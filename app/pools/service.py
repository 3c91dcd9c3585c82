"""Pools as the console and admin API see them: reads for the pools page, and operator
actions (start/stop/drain/restart a replica or a whole pool, LoRA load/unload) that are
checked, audited and handed to the pool's node through its Celery queue ``pool.<node>``.

The node-side work (processes, health, metrics) is in ``workers.pools.driver``.
"""
from __future__ import annotations

from typing import Any

from flask import current_app

from app.audit.service import record
from app.catalog.models import Replica, ReplicaMetric
from app.catalog.service import get_pool
from app.errors import Forbidden, NotFound, ValidationError
from app.extensions import db
from app.pools import states

ACTIONS = ("start", "stop", "drain", "restart")


def node_queue(node: str) -> str:
    return f"pool.{node}"


def _require(user) -> None:
    if not user.can("pool.operate"):
        raise Forbidden(f"your role ({user.role}) may not operate pools")


def get_replica(replica_id: int) -> Replica:
    replica = db.session.get(Replica, replica_id)
    if replica is None:
        raise NotFound("no such replica")
    return replica


def send_to_node(task: str, args: list, node: str) -> None:
    """Queue ``task`` on the Celery queue of the node that runs the pool's engines."""
    current_app.extensions["celery"].send_task(task, args=args, queue=node_queue(node))


def request_replica_action(user, replica_id: int, action: str) -> Replica:
    """Queue ``pools.<action>_replica`` on the replica's node (the node marks states)."""
    _require(user)
    if action not in ACTIONS:
        raise ValidationError("unknown action", {"action": [f"use one of {', '.join(ACTIONS)}"]})
    replica = get_replica(replica_id)
    if action in ("start", "drain") and not states.can(action, replica.state):
        raise ValidationError(f"cannot {action} a replica that is {replica.state}",
                              {"action": [f"replica is {replica.state}"]})
    record(user, f"replica.{action}", "replica", replica.id, after={"state": replica.state})
    db.session.commit()
    send_to_node(f"pools.{action}_replica", [replica.id], replica.pool.node)
    return replica


def request_pool_action(user, pool_id: int, action: str) -> list[Replica]:
    """The action on every wanted replica of the pool (index < desired_replicas)."""
    _require(user)
    if action not in ACTIONS:
        raise ValidationError("unknown action", {"action": [f"use one of {', '.join(ACTIONS)}"]})
    pool = get_pool(pool_id)
    from app.catalog.service import sync_replica_rows
    sync_replica_rows(pool)
    db.session.flush()
    chosen = [r for r in pool.replicas if r.index < pool.desired_replicas
              and (action not in ("start", "drain") or states.can(action, r.state))]
    record(user, f"pool.{action}", "pool", pool.id,
           after={"replicas": [r.id for r in chosen]})
    db.session.commit()
    for r in chosen:
        send_to_node(f"pools.{action}_replica", [r.id], pool.node)
    return chosen


def request_lora(user, pool_id: int, action: str, lora_name: str, lora_path: str = "") -> None:
    _require(user)
    pool = get_pool(pool_id)
    errors = {}
    if not lora_name.strip():
        errors["lora_name"] = ["is required"]
    if action == "load" and not lora_path.strip():
        errors["lora_path"] = ["is required"]
    if errors:
        raise ValidationError("invalid adapter", errors)
    record(user, f"pool.lora_{action}", "pool", pool.id,
           after={"lora_name": lora_name, "lora_path": lora_path})
    db.session.commit()
    args = [pool.id, lora_name, lora_path] if action == "load" else [pool.id, lora_name]
    send_to_node(f"pools.{action}_lora", args, pool.node)


def live_stats(replica_ids: list[int]) -> dict[int, dict[str, str]]:
    """Latest scraped stats per replica from Redis (missing when stale or never scraped)."""
    from app.redis_client import get_redis, keys
    from workers.pools.metrics import read_live
    try:
        r = get_redis()
        return {rid: read_live(r, keys(), rid) for rid in replica_ids}
    except Exception:  # noqa: BLE001 - the page still renders without live figures
        return {}


def metric_series(replica_ids: list[int], limit: int = 120) -> dict[int, list[dict[str, Any]]]:
    """Per replica, the last ``limit`` scrapes (oldest first) with rates between scrapes:
    prefix-cache hit rate and mean TTFT over each interval (the first one: since the
    engine started)."""
    out: dict[int, list[dict[str, Any]]] = {}
    for rid in replica_ids:
        rows = list(db.session.scalars(
            db.select(ReplicaMetric).where(ReplicaMetric.replica_id == rid)
            .order_by(ReplicaMetric.at.desc()).limit(limit)))[::-1]
        series = []
        prev = None
        for row in rows:
            point = {"at": row.at.isoformat(), "kv_cache_usage_perc": row.kv_cache_usage_perc,
                     "queue": row.num_requests_waiting, "running": row.num_requests_running,
                     "hit_rate": None, "ttft_s": None}
            # over the interval since the previous scrape; the first kept scrape (or one
            # after an engine restart reset its counters) covers the engine's life so far,
            # as the live table does
            fresh = prev is None or row.prefix_cache_queries < prev.prefix_cache_queries \
                or row.ttft_seconds_count < prev.ttft_seconds_count
            base = None if fresh else prev
            dq = row.prefix_cache_queries - (base.prefix_cache_queries if base else 0)
            dh = row.prefix_cache_hits - (base.prefix_cache_hits if base else 0)
            dn = row.ttft_seconds_count - (base.ttft_seconds_count if base else 0)
            ds = row.ttft_seconds_sum - (base.ttft_seconds_sum if base else 0)
            point["hit_rate"] = dh / dq if dq > 0 else None
            point["ttft_s"] = ds / dn if dn > 0 else None
            series.append(point)
            prev = row
        out[rid] = series
    return out
