"""A replica that restarts comes back holding its pool's adapters: the real pool worker
hot-loads a promoted adapter, the engine is killed, the supervisor restarts it, and the
adapter is loaded on the new process before the replica is marked healthy again."""
from __future__ import annotations

import os
import signal
import uuid

import httpx

from app.adapters.models import Adapter
from app.catalog.models import Replica
from app.catalog.service import sync_replica_rows
from app.extensions import db
from tests.engine.test_lora import PROMPT, _train_adapter
from tests.factories import PoolFactory, TenantFactory
from tests.pools.conftest import free_port_pair
from workers.pools import launcher


def _replica(pool_id: int) -> Replica:
    db.session.expire_all()
    return db.session.scalars(db.select(Replica).where(Replica.pool_id == pool_id)).one()


def _adapter(adapter_id: int) -> Adapter:
    db.session.expire_all()
    return db.session.get(Adapter, adapter_id)


def _answer(url: str, model: str) -> httpx.Response:
    return httpx.post(f"{url}/v1/chat/completions", timeout=60, json={
        "model": model, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 8,
        "temperature": 0})


def test_a_restarted_replica_reloads_its_pools_adapters_before_it_serves(
        app, pool_worker, tiny_model_dir, tmp_path):
    from app.pools.service import request_pool_action
    from tests.factories import UserFactory
    celery = app.extensions["celery"]
    artifact = _train_adapter(tiny_model_dir, tmp_path / "bananas")
    pool = PoolFactory(name=f"lora-{uuid.uuid4().hex[:6]}", engine="reference",
                       model=str(tiny_model_dir), served_model_name="tiny", desired_replicas=1,
                       base_port=free_port_pair(), node="local",
                       options={"threads": 1, "lora": {"max_loras": 2, "max_lora_rank": 8}})
    sync_replica_rows(pool)
    adapter = Adapter(tenant_id=TenantFactory().id, workflow="wf-fruit", pool_id=pool.id,
                      name="bananas", state="promoted", canary_pct=100,
                      artifact_path=str(artifact))
    retired = Adapter(tenant_id=adapter.tenant_id, workflow="wf-old", pool_id=pool.id,
                      name="retired-one", state="retired", artifact_path=str(artifact))
    db.session.add_all([adapter, retired])
    db.session.commit()
    ops = UserFactory(role="ops")
    pids: list[int] = []
    try:
        request_pool_action(ops, pool.id, "start")
        pool_worker.wait_for(lambda: _replica(pool.id).state == "healthy", 180, "replica healthy")
        first = _replica(pool.id)
        first_pid, url = first.pid, first.url   # the ORM object refreshes below
        pids.append(first_pid)
        # started with the adapter already promoted: it was loaded on the way to healthy
        assert _adapter(adapter.id).loaded == {str(first.id): "ok"}
        assert "banana" in _answer(url, "bananas").json()["choices"][0]["message"]["content"]

        os.kill(first_pid, signal.SIGKILL)

        def back() -> bool:
            celery.send_task("pools.supervise", args=["local"], queue="pool.local")
            r = _replica(pool.id)
            return r.state == "healthy" and r.restarts == 1

        pool_worker.wait_for(back, 180, "replica restarted by the supervisor")
        again = _replica(pool.id)
        pids.append(again.pid)
        assert again.pid != first_pid
        # the new process holds the adapter: loaded before it was marked healthy
        assert _adapter(adapter.id).loaded == {str(again.id): "ok"}
        out = _answer(again.url, "bananas")
        assert out.status_code == 200 and "banana" in out.json()["choices"][0]["message"]["content"]
        # only the adapters the pool should hold
        assert _answer(again.url, "retired-one").status_code == 404
        assert _adapter(retired.id).loaded in ({}, None)
    finally:
        request_pool_action(ops, pool.id, "stop")
        pool_worker.wait_for(lambda: _replica(pool.id).state == "stopped", 60, "stopped")
        for pid in pids:
            launcher.terminate(pid, grace_s=5)
