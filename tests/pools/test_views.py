"""Pools page and admin API: who may operate, CSRF, what is shown, what gets queued."""
from __future__ import annotations

import json
import time

from app.catalog.models import ReplicaMetric
from app.catalog.service import sync_replica_rows
from app.extensions import db
from app.redis_client import keys
from tests.console.web import browser, csrf_from, login
from tests.factories import PoolFactory, TenantFactory, UserFactory
from workers.pools.metrics import store_live


def _pool(desired: int = 2):
    # A node no test worker consumes, so queued tasks stay in the queue to be inspected.
    pool = PoolFactory(desired_replicas=desired, base_port=18800, node="viewsnode")
    sync_replica_rows(pool)
    db.session.commit()
    return pool


def _queued(redis_client, queue: str) -> list[dict]:
    # Celery's Redis transport keeps a queue as a list named after it, under our prefix.
    raw = redis_client.lrange(f"{keys().ns}:celery:{queue}", 0, -1)
    return [json.loads(m) for m in raw]


def test_ops_sees_live_stats_and_buttons_and_can_queue_a_pool_start(app, redis_client):
    pool = _pool()
    r0, r1 = pool.replicas
    r0.state = "healthy"
    db.session.add(ReplicaMetric(replica_id=r0.id, prefix_cache_queries=100,
                                 prefix_cache_hits=10, ttft_seconds_sum=1, ttft_seconds_count=10))
    db.session.add(ReplicaMetric(replica_id=r0.id, prefix_cache_queries=200,
                                 prefix_cache_hits=90, ttft_seconds_sum=1.5,
                                 ttft_seconds_count=20))
    db.session.commit()
    store_live(redis_client, keys(), r0.id, {"prefix_cache_hit_rate": 0.886,
                                             "kv_cache_usage_perc": 0.25,
                                             "num_requests_waiting": 3.0,
                                             "num_requests_running": 1.0,
                                             "ttft_mean_seconds": 0.0195}, at=time.time())
    ops = UserFactory(role="ops")
    web = browser(app)
    login(web, ops.email)
    page = web.get("/pools")
    html = page.get_data(as_text=True)
    assert page.status_code == 200
    assert "88.6%" in html and "25.0%" in html and "3 / 1" in html and "20 ms" in html
    assert html.count("Start pool") == 1 and "Hot-load on every replica" in html
    series = json.loads(html.split("const SERIES = ", 1)[1].split(";\n", 1)[0])
    assert series[str(r0.id)][1]["hit_rate"] == 0.8  # (90-10)/(200-100) between scrapes
    # the first scrape covers the engine's life so far (as the live table): not a gap
    assert series[str(r0.id)][0]["hit_rate"] == 0.1 and series[str(r0.id)][0]["ttft_s"] == 0.1
    before = len(_queued(redis_client, f"pool.{pool.node}"))
    resp = web.post(f"/pools/{pool.id}/action", data={"action": "start",
                                                      "csrf_token": csrf_from(html)})
    assert resp.status_code == 302
    queued = _queued(redis_client, f"pool.{pool.node}")
    tasks = [(m["headers"]["task"], m["headers"]["argsrepr"]) for m in queued[:len(queued) - before]]
    # r0 is already healthy: only r1 needs starting
    assert tasks == [("pools.start_replica", f"[{r1.id}]")]
    assert web.get("/pools/plotly.js").status_code == 200


def test_viewer_and_tenant_users_cannot_operate(app, redis_client):
    pool = _pool(1)
    viewer = UserFactory(role="viewer")
    web = browser(app)
    login(web, viewer.email)
    html = web.get("/pools").get_data(as_text=True)
    assert "Start pool" not in html
    token = csrf_from(html)
    assert web.post(f"/pools/{pool.id}/action",
                    data={"action": "start", "csrf_token": token}).status_code == 403
    tenant_ops = UserFactory(role="ops", tenant=TenantFactory())
    web2 = browser(app)
    login(web2, tenant_ops.email)
    assert web2.get("/pools").status_code == 403


def test_operator_forms_need_csrf(app):
    pool = _pool(1)
    ops = UserFactory(role="ops")
    web = browser(app)
    login(web, ops.email)
    assert web.post(f"/pools/{pool.id}/action", data={"action": "stop"}).status_code == 400


def test_admin_api_queues_the_same_actions(app, redis_client):
    from app.auth.service import create_admin_token
    pool = _pool(1)
    ops = UserFactory(role="ops")
    _, token = create_admin_token(ops, "t")
    client = app.test_client()
    hdr = {"Authorization": f"Bearer {token}"}
    resp = client.post(f"/api/v1/pools/replicas/{pool.replicas[0].id}/actions", headers=hdr,
                       json={"action": "drain"})
    assert resp.status_code == 422  # pending replica cannot drain
    resp = client.post(f"/api/v1/pools/{pool.id}/actions", headers=hdr, json={"action": "start"})
    assert resp.status_code == 202 and resp.get_json()["queued"] == [pool.replicas[0].id]
    resp = client.post(f"/api/v1/pools/{pool.id}/lora", headers=hdr,
                       json={"lora_name": "revops", "lora_path": "/adapters/revops"})
    assert resp.status_code == 202
    tasks = [m["headers"]["task"] for m in _queued(redis_client, f"pool.{pool.node}")]
    assert "pools.load_lora" in tasks
    status = client.get("/api/v1/pools/status", headers=hdr).get_json()
    assert status["pools"][0]["replicas"][0]["state"] == "pending"


def test_beat_supervise_and_scrape_fan_out_to_each_node_queue(app, redis_client):
    from workers.tasks.pools import scrape, supervise
    pool = _pool(1)
    PoolFactory(node="othernode")
    assert supervise() == sorted({pool.node, "othernode"})
    scrape()
    for node in (pool.node, "othernode"):
        msgs = [(m["headers"]["task"], m["headers"]["argsrepr"])
                for m in _queued(redis_client, f"pool.{node}")]
        assert ("pools.supervise", f"['{node}']") in msgs
        assert ("pools.scrape", f"['{node}']") in msgs


def test_each_replica_shows_the_adapters_its_engine_holds(app):
    from app.adapters.models import Adapter
    pool = _pool()
    r0, r1 = pool.replicas
    tenant = TenantFactory()
    served = Adapter(tenant_id=tenant.id, workflow="wf-a", pool_id=pool.id, name="lora-inv-7",
                     state="promoted", canary_pct=100,
                     loaded={str(r0.id): "ok", str(r1.id): "HTTP 500: out of memory"})
    shadowed = Adapter(tenant_id=tenant.id, workflow="wf-b", pool_id=pool.id, name="lora-tix-9",
                       state="shadow", loaded={str(r1.id): "ok"})
    gone = Adapter(tenant_id=tenant.id, workflow="wf-c", pool_id=pool.id, name="lora-old-2",
                   state="rolled_back", loaded={str(r0.id): "ok"})   # unloaded since
    db.session.add_all([served, shadowed, gone])
    db.session.commit()
    web = browser(app)
    login(web, UserFactory(role="viewer").email)
    html = web.get("/pools").get_data(as_text=True)
    row0 = html.split(f'data-replica="{r0.id}"', 1)[1].split("</tr>", 1)[0]
    row1 = html.split(f'data-replica="{r1.id}"', 1)[1].split("</tr>", 1)[0]
    assert "lora-inv-7" in row0 and "not loaded" not in row0 and "lora-old-2" not in row0
    assert f'href="/adapters/{served.id}"' in row0
    assert "lora-tix-9" in row1 and "shadow" in row1
    assert "lora-inv-7" in row1 and "not loaded" in row1 and "HTTP 500: out of memory" in row1
