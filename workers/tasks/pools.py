"""Pool driving tasks. Replica tasks run on the node's queue ``pool.<node>``; the beat
entries ``pools.supervise`` / ``pools.scrape`` arrive without a node and fan out one task
per node that has pools."""
from __future__ import annotations

import json

from celery import shared_task


def _fan_out(task: str) -> list[str]:
    from flask import current_app

    from app.catalog.models import Pool
    from app.extensions import db
    from app.pools.service import node_queue
    nodes = sorted(set(db.session.scalars(db.select(Pool.node))))
    celery = current_app.extensions["celery"]
    for node in nodes:
        celery.send_task(task, args=[node], queue=node_queue(node))
    return nodes


def _replica_task(action: str):
    """``pools.<action>_replica``: one driver call on one replica (on its node's queue)."""
    def run(replica_id: int) -> str:
        from workers.pools import driver
        return getattr(driver, f"{action}_replica")(replica_id)
    run.__name__ = run.__qualname__ = f"{action}_replica"
    return shared_task(name=f"pools.{action}_replica")(run)


start_replica = _replica_task("start")
stop_replica = _replica_task("stop")
drain_replica = _replica_task("drain")
restart_replica = _replica_task("restart")


@shared_task(name="pools.supervise")
def supervise(node: str | None = None):
    """Restart dead replicas with backoff (marked ``down`` meanwhile); promote started ones."""
    if node is None:
        return _fan_out("pools.supervise")
    from workers.pools.driver import supervise_node
    return {str(k): v for k, v in supervise_node(node).items()}


@shared_task(name="pools.kv_index")
def kv_index(node: str | None = None):
    """Keep the node's KV-event subscriber running on its current replicas (issue 17)."""
    if node is None:
        return _fan_out("pools.kv_index")
    from workers.pools.driver import kv_index_node
    return kv_index_node(node)


@shared_task(name="pools.scrape")
def scrape(node: str | None = None):
    if node is None:
        return _fan_out("pools.scrape")
    from workers.pools.driver import scrape_node
    return scrape_node(node)


def _keep_result(pool_id: int, action: str, results: dict) -> dict:
    from app.redis_client import get_redis, keys
    out = {str(k): v for k, v in results.items()}
    get_redis().set(keys().pool_lora_last(pool_id),
                    json.dumps({"action": action, "results": out}), ex=86400)
    return out


@shared_task(name="pools.load_lora", ignore_result=False)
def load_lora(pool_id: int, lora_name: str, lora_path: str) -> dict:
    """Per-replica ``{"ok", "status", "detail"}``; also kept for the pools page."""
    from workers.pools.driver import load_lora as run
    return _keep_result(pool_id, f"load {lora_name}", run(pool_id, lora_name, lora_path))


@shared_task(name="pools.unload_lora", ignore_result=False)
def unload_lora(pool_id: int, lora_name: str) -> dict:
    from workers.pools.driver import unload_lora as run
    return _keep_result(pool_id, f"unload {lora_name}", run(pool_id, lora_name))
