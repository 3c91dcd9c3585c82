"""``flask drill replica-loss`` (CD-28C) on a supervised pool: four reference replicas that
the pool worker started and supervises, behind the real gateway. The drill stops two of
them through the pool driver, so they stay ``stopped`` while the supervisor keeps running
(a SIGTERM alone would leave them ``healthy`` in SQL, and the supervisor would restart
them mid-drill). The same drill started from the Drills page runs on the pool's node
queue. Lives with the pools tests because it needs their pool worker."""
from __future__ import annotations

import threading
import uuid

from app.audit.models import AuditLog
from app.catalog.models import Replica
from app.catalog.service import sync_replica_rows
from app.drills.models import DrillRun
from app.drills.service import list_runs
from app.extensions import db
from app.pools.service import request_pool_action
from tests.console.web import browser, login, submit
from tests.factories import PoolFactory, UserFactory
from tests.pools.conftest import free_port_run, tenant_on_pool
from workers.pools import launcher


def _replicas(pool_id: int) -> list[Replica]:
    db.session.expire_all()
    return list(db.session.scalars(db.select(Replica).where(Replica.pool_id == pool_id)
                                   .order_by(Replica.index)))


def _started_pool(pool_worker, tiny_model_dir, n: int):
    pool = PoolFactory(name=f"drill-{uuid.uuid4().hex[:6]}", engine="reference",
                       model=str(tiny_model_dir), served_model_name="tiny", desired_replicas=n,
                       base_port=free_port_run(n), node="local",
                       options={"threads": 1, "max_prefix_tokens": 8192})
    sync_replica_rows(pool)
    db.session.commit()
    request_pool_action(UserFactory(role="ops"), pool.id, "start")
    return pool


def _stop_all(pool) -> None:
    from workers.pools.driver import stop_replica
    for replica in _replicas(pool.id):
        pid = replica.pid
        stop_replica(replica.id)
        launcher.terminate(pid, grace_s=5)


def test_cli_drill_stops_replicas_through_the_driver_and_records_the_run(
        app, runner, pool_worker, tiny_model_dir, gateway, frontier):
    celery = app.extensions["celery"]
    pool = _started_pool(pool_worker, tiny_model_dir, 4)
    beat = threading.Event()
    try:
        pool_worker.wait_for(lambda: all(r.state == "healthy" for r in _replicas(pool.id)),
                             300, "four replicas healthy")
        key = tenant_on_pool(pool, frontier, gateway, session_key="header")

        def supervise_like_beat() -> None:   # the beat entry pools.supervise, faster
            while not beat.wait(0.5):
                celery.send_task("pools.supervise", args=["local"], queue="pool.local")
        ticker = threading.Thread(target=supervise_like_beat, daemon=True)
        ticker.start()
        res = runner.invoke(args=[
            "drill", "replica-loss", "--url", gateway.url, "--key", key, "--pool", pool.name,
            "--stop", "2", "--sessions", "8", "--turns-before", "2", "--turns-after", "3",
            "--model", "tier-1", "--timeout", "60"])
        beat.set()
        ticker.join(5)
        assert res.exit_code == 0, res.output

        run = db.session.scalars(db.select(DrillRun).where(DrillRun.kind == "replica-loss")
                                 .order_by(DrillRun.id.desc())).first()
        assert run is not None and run.params["pool"] == pool.name
        r = run.result
        assert run.status == "passed", r
        assert r["requests"] == 40 and r["failed_requests"] == 0, r["failures"]
        assert r["sessions_on_dead_replicas"] > 0
        assert r["sessions_moved_from_live_replicas"] == 0
        assert r["replica_choice"] == "sluice" and r["live_moves_allowed"] == 0   # its key's
        assert r["served_by_dead_after_loss"] == 0
        assert f"drill #{run.id} passed" in res.output

        # the stopped replicas stayed stopped through several supervisor passes
        celery.send_task("pools.supervise", args=["local"], queue="pool.local")
        after = {x.id: x for x in _replicas(pool.id)}
        dead = set(r["stopped"])
        assert len(dead) == 2
        for rid, replica in after.items():
            if rid in dead:
                assert replica.state == "stopped" and replica.pid is None
                assert replica.restarts == 0
            else:
                assert replica.state == "healthy"
        assert {k: v for k, v in r["replica_states"].items() if int(k) in dead} == {
            str(rid): "stopped" for rid in dead}
        audits = db.session.scalars(db.select(AuditLog).where(
            AuditLog.action == "replica.stop", AuditLog.entity_id.in_([str(i) for i in dead])))
        assert {a.after["drill_run"] for a in audits} == {run.id}
    finally:
        beat.set()
        _stop_all(pool)


def test_console_queues_the_drill_on_the_pools_node_and_shows_its_row(
        app, pool_worker, tiny_model_dir, gateway, frontier):
    pool = _started_pool(pool_worker, tiny_model_dir, 3)
    try:
        pool_worker.wait_for(lambda: all(r.state == "healthy" for r in _replicas(pool.id)),
                             300, "three replicas healthy")
        key = tenant_on_pool(pool, frontier, gateway, session_key="header")
        web = browser(app)
        login(web, UserFactory(role="ops").email)
        resp = submit(web, "/drills", {"pool_id": str(pool.id), "url": gateway.url, "key": key,
                                       "model": "tier-1", "stop_count": "1", "sessions": "6",
                                       "turns_before": "2", "turns_after": "2"},
                      action="/drills/replica-loss")
        assert resp.status_code == 303
        (run,) = list_runs("replica-loss")
        assert run.params["node"] == "local" and key not in str(run.params)
        page = web.get("/drills").get_data(as_text=True)
        assert 'http-equiv="refresh"' in page                  # progress shows as it goes

        def finished():
            db.session.expire_all()
            r = db.session.get(DrillRun, run.id)
            return r if r.status != "running" else None

        done = pool_worker.wait_for(finished, 300, "the queued drill")
        r = done.result
        assert done.status == "passed", r
        assert r["requests"] == 24 and r["failed_requests"] == 0
        assert [s for s, st in r["replica_states"].items() if st == "stopped"] == [
            str(x) for x in r["stopped"]]
        html = web.get("/drills").get_data(as_text=True)
        assert "0 of 24 requests failed" in html and "| loss |" in html
        assert '"sessions_moved"' not in html and 'http-equiv="refresh"' not in html
        assert db.session.scalar(db.select(AuditLog).where(
            AuditLog.action == "drill.start", AuditLog.entity_id == str(run.id))) is not None
    finally:
        _stop_all(pool)
