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
from tests.pools.conftest import free_port_pair, tenant_on_pool
from workers.pools import launcher


def _replicas(pool_id: int) -> list[Replica]:
    db.session.expire_all()
    return list(db.session.scalars(db.select(Replica).where(Replica.pool_id == pool_id)
                                   .order_by(Replica.index)))


def _snapshot_states(redis_client, pool_id: int) -> dict[int, str]:
    snap = json.loads(redis_client.get(keys().snapshot_data()) or "{}")
    pool = snap.get("pools", {}).get(str(pool_id), {})
    return {r["id"]: r["state"] for r in pool.get("replicas", [])}


def _served(replicas) -> dict[int, float]:
    """Requests each replica has finished, from its own /metrics."""
    from workers.pools.metrics import parse_prometheus
    out = {}
    for r in replicas:
        try:
            text = httpx.get(f"{r.url}/metrics", timeout=5).text
        except httpx.HTTPError:
            out[r.id] = -1.0
            continue
        out[r.id] = sum(v for (n, _), v in parse_prometheus(text).items()
                        if n == "vllm:request_success_total")
    return out


def _via_gateway(gateway, key: str, n: int) -> list[int]:
    codes = []
    for i in range(n):
        resp = httpx.post(f"{gateway.url}/v1/chat/completions", timeout=60,
                          headers={"authorization": f"Bearer {key}"},
                          json={"model": "tier-1", "max_tokens": 4, "temperature": 0,
                                "messages": [{"role": "system", "content": f"workflow {i}"},
                                             {"role": "user", "content": f"question {i}"}]})
        codes.append(resp.status_code)
        tier = resp.headers.get("x-sluice-tier")
        assert tier == "tier-1", (resp.status_code, tier, dict(resp.headers), resp.text[:500],
                                  gateway.log.name)
    return codes


def test_worker_runs_supervises_and_restarts_a_reference_pool(app, redis_client, pool_worker,
                                                              tiny_model_dir, gateway, frontier):
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
        # the snapshot follows SQL: each replica's publish comes after its commit
        pool_worker.wait_for(lambda: set(_snapshot_states(redis_client, pool.id).values())
                             == {"healthy"}, 30, "both replicas healthy in the snapshot")
        for r in replicas:
            out = httpx.post(f"{r.url}/v1/chat/completions", timeout=60, json={
                "model": "tiny", "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 4, "temperature": 0})
            assert out.status_code == 200 and out.json()["usage"]["completion_tokens"] >= 1

        key = tenant_on_pool(pool, frontier, gateway)
        before = _served(replicas)
        assert _via_gateway(gateway, key, 6) == [200] * 6
        after_gw = _served(replicas)
        assert sum(after_gw.values()) - sum(before.values()) >= 6  # the engines served them

        celery.send_task("pools.scrape", args=["local"], queue="pool.local")
        def scraped() -> bool:
            db.session.expire_all()
            rows = db.session.scalar(db.select(db.func.count(ReplicaMetric.id)).where(
                ReplicaMetric.replica_id.in_([r.id for r in replicas])))
            return rows >= 2 and all(redis_client.exists(keys().replica_stats(r.id))
                                     for r in replicas)
        pool_worker.wait_for(scraped, 60, "live stats in Redis and rows in SQL")
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

        def marked_down() -> bool:
            celery.send_task("pools.supervise", args=["local"], queue="pool.local")
            snap = _snapshot_states(redis_client, pool.id)
            return (_replicas(pool.id)[0].state == "down" and snap.get(victim.id) == "down"
                    and snap.get(other.id) == "healthy")

        pool_worker.wait_for(marked_down, 60, "victim marked down in SQL and the snapshot")
        # No supervisor tick now, so it stays down: the gateway keeps serving, all from
        # the survivor.
        from tests.gateway.conftest import health, wait_for
        version = int(redis_client.get(keys().snapshot_version()))
        wait_for(lambda: (health(gateway).get("snapshot_version") or 0) >= version, 15,
                 "gateway reloads the snapshot")
        served_before = _served([other])[other.id]
        assert _via_gateway(gateway, key, 4) == [200] * 4
        assert _served([other])[other.id] - served_before >= 4

        def back() -> bool:
            celery.send_task("pools.supervise", args=["local"], queue="pool.local")
            r = _replicas(pool.id)[0]
            return r.state == "healthy" and r.restarts == 1

        pool_worker.wait_for(back, 180, "victim restarted by the supervisor")
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


def test_an_engine_that_cannot_load_is_marked_down(app, pool_worker, tmp_path):
    from app.pools.service import request_pool_action
    broken = tmp_path / "broken-model"
    broken.mkdir()
    (broken / "config.json").write_text("{}")
    pool = PoolFactory(name=f"broken-{uuid.uuid4().hex[:6]}", engine="reference",
                       model=str(broken), desired_replicas=1, base_port=free_port_pair(),
                       node="local", options={"threads": 1})
    sync_replica_rows(pool)
    db.session.commit()
    ops = UserFactory(role="ops")
    request_pool_action(ops, pool.id, "start")
    try:
        pool_worker.wait_for(lambda: _replicas(pool.id)[0].state == "down", 120,
                             "broken replica marked down")
        replica = _replicas(pool.id)[0]
        assert "load failed" in replica.last_error and replica.pid is None
    finally:
        request_pool_action(ops, pool.id, "stop")
        pool_worker.wait_for(lambda: _replicas(pool.id)[0].state == "stopped", 60, "stopped")
