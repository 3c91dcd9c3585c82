"""The Drills page: ops start drills (CSRF), workers run the long ones, and each kind of
run shows as a formatted row, not raw JSON."""
from __future__ import annotations

from app.drills.service import list_runs
from app.redis_client import keys
from app.replica_routing import service as routing
from tests.console.web import browser, csrf_from, login, submit
from tests.factories import PoolFactory, UserFactory
from tests.gateway.conftest import make_world


def _ops(app):
    client = browser(app)
    login(client, UserFactory(role="ops").email)
    return client


def test_ops_see_start_forms_and_a_formatted_simulation_row(app):
    routing.run_seed_simulation(replicas=4, kv_tokens=65_536, requests=400)
    html = _ops(app).get("/drills").get_data(as_text=True)
    for form in ("form-cache-poisoning", "form-domain-shift"):
        assert f'id="{form}"' in html
    assert "No pool has two healthy replicas" in html       # nothing to lose one of yet
    sim = list_runs("prefix-routing-sim")[0].result
    row = f"sluice {sim['policies']['sluice']['hit_rate'] * 100:.1f}% hit"
    assert row in html and "400 requests on 4 replicas" in html
    assert '"policies"' not in html                         # not a JSON dump


def test_starting_drills_needs_ops_and_csrf_and_a_key(app):
    viewer = browser(app)
    login(viewer, UserFactory(role="viewer").email)
    assert viewer.get("/drills").status_code == 403
    assert viewer.post("/drills/replica-loss", data={}).status_code in (400, 403)
    ops = _ops(app)
    assert ops.post("/drills/domain-shift", data={"csrf_token": "forged"}).status_code == 400
    pool = PoolFactory(name="two")
    from app.catalog.models import Replica
    from app.extensions import db
    for i in range(2):
        db.session.add(Replica(pool_id=pool.id, index=i, url=f"http://127.0.0.1:{9 + i}",
                               state="healthy"))
    db.session.commit()
    page = ops.get("/drills").get_data(as_text=True)
    assert 'id="form-replica-loss"' in page and "two (2 healthy" in page
    resp = ops.post("/drills/replica-loss", follow_redirects=True, data={
        "csrf_token": csrf_from(page), "pool_id": str(pool.id), "url": "http://127.0.0.1:9",
        "key": "", "stop_count": "1"})
    assert "key: a tenant API key is required" in resp.get_data(as_text=True)
    resp = ops.post("/drills/replica-loss", follow_redirects=True, data={
        "csrf_token": csrf_from(page), "pool_id": str(pool.id), "url": "http://127.0.0.1:9",
        "key": "sk-x", "stop_count": "2"})
    assert "cannot stop 2 and keep serving" in resp.get_data(as_text=True)
    assert list_runs("replica-loss") == [] and list_runs("domain-shift") == []


def test_domain_shift_started_from_the_page_runs_on_a_worker(app, celery_worker, redis_client,
                                                            gateway, fake_replicas, frontier):
    w = make_world(app, gateway, [s.url for s in fake_replicas], frontier.url,
                   policy={"frontier_first_hours": 0, "cache_enabled": False})
    ops = _ops(app)
    resp = submit(ops, "/drills", {"url": gateway.url, "key": w.key, "n_ood": "2",
                                   "n_control": "1", "max_tokens": "8",
                                   "unmonitored_tier": "tier-1", "reference_tier": "tier-3"},
                  action="/drills/domain-shift")
    assert resp.status_code == 303

    def finished():
        from app.extensions import db
        db.session.expire_all()
        runs = [r for r in list_runs("domain-shift") if r.status != "running"]
        return runs[0] if runs else None

    run = celery_worker.wait_for(finished, 120, "the domain-shift run")
    assert run.status in ("passed", "failed"), run.result
    assert run.result["ood"]["requests"] == 2 and run.result["control"]["requests"] == 1
    assert "key" not in run.params and w.key not in str(run.params)
    assert not list(redis_client.scan_iter(keys().k("drill", "secret", "*")))  # taken once
    html = ops.get("/drills").get_data(as_text=True)
    assert "out-of-domain escalation" in html and "aborted-tier bytes to client 0" in html
    # the task-accuracy pass the form asked for: every prompt judged against tier 3's answer
    assert run.params["unmonitored_tier"] == "tier-1" and run.params["reference_tier"] == "tier-3"
    acc = run.result["accuracy"]
    assert acc["with_monitor"]["n"] == 3 and acc["without_monitor"]["n"] == 3
    assert "task accuracy (judged by tier-3" in html
    assert '"aborted_tier_bytes_to_client"' not in html

    # a bad URL reaches the worker's validation and shows as an error row
    submit(ops, "/drills", {"url": "ftp://nowhere", "key": w.key}, action="/drills/domain-shift")
    bad = celery_worker.wait_for(lambda: next((r for r in list_runs("domain-shift")
                                               if r.id != run.id), None), 60, "the error run")
    assert bad.status == "error" and "url:" in bad.result["error"]
