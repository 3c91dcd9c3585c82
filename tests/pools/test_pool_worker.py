"""A real Celery worker drives a pool of two reference-engine replicas: started from the
console, both healthy, scraped; one killed -> marked down (out of the snapshot's routable
set) -> restarted by the supervisor."""
from __future__ import annotations

import json
import os
import signal
import uuid

import httpx

from app.catalog.models import Replica, ReplicaMetric
from app.catalog.service import sync_replica_rows
from app.extensions import db
from app.redis_client import keys
from tests.console.web import browser, login, submit
from tests.factories import PoolFactory, UserFactory
from tests.pools.conftest import free_port_pair
from workers.pools import launcher


def _replicas(pool_id: int) -> list[Replica]:
    db.session.expire_all()
    return list(db.session.scalars(db.select(Replica).where(Replica.pool_id == pool_id)
                                   .order_by(Replica.index)))


def _snapshot_states(redis_client, pool_id: int) -> dict[int, str]:
    snap = json.loads(redis_client.get(keys().k("snapshot", "data")) or "{}")
    pool = snap.get("pools", {}).get(str(pool_id), {})
    return {r["id"]: r["state"] for r in pool.get("replicas", [])}


def test_worker_runs_supervises_and_restarts_a_reference_pool(app, redis_client, pool_worker,
                                                              tiny_model_dir):
    celery = app.extensions["celery"]
    pool = PoolFactory(name=f"ref-{uuid.uuid4().hex[:6]}", engine="reference",
                       model=str(tiny_model_dir), served_model_name="tiny", desired_replicas=2,
                       base_port=free_port_pair(), node="local",
                       options={"threads": 1, "max_prefix_tokens": 2048})
    sync_replica_rows(pool)
    db.session.commit()
    ops = UserFactory(role="ops")
    web = browser(app)
    login(web, ops.email)
    pids: list[int] = []
    try:
        resp = submit(web, "/pools", {"action": "start"}, action=f"/pools/{pool.id}/action")
        assert resp.status_code == 302
        pool_worker.wait_for(lambda: all(r.state == "healthy" for r in _replicas(pool.id)),
                             180, "both replicas healthy")
        replicas = _replicas(pool.id)
        pids = [r.pid for r in replicas]
        assert len(set(pids)) == 2 and all(launcher.is_running(p) for p in pids)
        assert set(_snapshot_states(redis_client, pool.id).values()) == {"healthy"}
        for r in replicas:
            out = httpx.post(f"{r.url}/v1/chat/completions", timeout=60, json={
                "model": "tiny", "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 4, "temperature": 0})
            assert out.status_code == 200 and out.json()["usage"]["completion_tokens"] >= 1

        celery.send_task("pools.scrape", args=["local"], queue="pool.local")
        pool_worker.wait_for(lambda: all(redis_client.exists(keys().k("replica", r.id, "stats"))
                                         for r in replicas), 60, "live stats in Redis")
        stats = redis_client.hgetall(keys().k("replica", replicas[0].id, "stats"))
        assert float(stats[b"prefix_cache_queries"]) > 0
        assert redis_client.ttl(keys().k("replica", replicas[0].id, "stats")) > 0
        db.session.expire_all()
        assert db.session.scalar(db.select(db.func.count(ReplicaMetric.id))
                                 .where(ReplicaMetric.replica_id == replicas[0].id)) >= 1
        page = web.get("/pools").get_data(as_text=True)
        assert page.count('data-state="healthy"') == 2 and "plotly.js" in page

        victim, other = replicas
        victim_pid, other_pid = victim.pid, other.pid  # the ORM objects refresh below
        os.kill(victim_pid, signal.SIGKILL)
        seen_down = {"sql": False, "snapshot": False}

        def down_then_back() -> bool:
            celery.send_task("pools.supervise", args=["local"], queue="pool.local")
            r = {x.id: x for x in _replicas(pool.id)}
            if r[victim.id].state == "down":
                seen_down["sql"] = True
                snap = _snapshot_states(redis_client, pool.id)
                if snap.get(victim.id) == "down" and snap.get(other.id) == "healthy":
                    seen_down["snapshot"] = True
            return (seen_down["sql"] and r[victim.id].state == "healthy"
                    and r[victim.id].restarts == 1)

        pool_worker.wait_for(down_then_back, 180, "victim marked down, then restarted")
        assert seen_down["snapshot"], "the snapshot never showed the dead replica as down"
        after = {x.id: x for x in _replicas(pool.id)}
        assert after[victim.id].pid != victim_pid and launcher.is_running(after[victim.id].pid)
        assert after[other.id].pid == other_pid and after[other.id].restarts == 0
        pids.append(after[victim.id].pid)

        resp = submit(web, "/pools", {"action": "stop"}, action=f"/pools/{pool.id}/action")
        assert resp.status_code == 302
        pool_worker.wait_for(lambda: all(r.state == "stopped" for r in _replicas(pool.id)),
                             60, "pool stopped")
        pool_worker.wait_for(lambda: not any(launcher.is_running(p) for p in pids), 30,
                             "engine processes gone")
    finally:
        for pid in pids + [r.pid for r in _replicas(pool.id) if r.pid]:
            launcher.terminate(pid, grace_s=5)
