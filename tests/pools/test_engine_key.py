"""Engines on a network interface have their own key (security finding 13): with
SLUICE_POOL_ENGINE_SECRET set, a pool's engines require a key derived from it and the pool
id (vLLM's --api-key, given as VLLM_API_KEY), the driver's LoRA calls and the gateway send
it, and without a secret an engine is only started on the loopback."""
from __future__ import annotations

import json
import uuid

import httpx
import pytest

from app.catalog.service import sync_replica_rows
from app.contract.secrets import POOL_ENGINE_SECRET, pool_engine_key
from app.extensions import db
from tests.factories import PoolFactory
from tests.pools.conftest import free_port_pair
from workers.pools import driver, launcher

SECRET = "node-and-gateway-shared-secret"


def _pool(tiny_model_dir, **kw):
    pool = PoolFactory(name=f"keyed-{uuid.uuid4().hex[:6]}", engine="reference",
                       model=str(tiny_model_dir), served_model_name="tiny", desired_replicas=1,
                       base_port=free_port_pair(), node="keynode", options={"threads": 1}, **kw)
    sync_replica_rows(pool)
    db.session.commit()
    return pool


def _ask(url: str, key: str | None) -> httpx.Response:
    return httpx.post(f"{url}/v1/chat/completions", timeout=60,
                      headers={"authorization": f"Bearer {key}"} if key else {},
                      json={"model": "tiny", "max_tokens": 2,
                            "messages": [{"role": "user", "content": "hi"}]})


def test_keys_are_per_pool_and_need_the_secret():
    env = {POOL_ENGINE_SECRET: SECRET}
    assert pool_engine_key(1, env) != pool_engine_key(2, env)
    assert pool_engine_key(1, env).startswith("sk-pool-") and pool_engine_key(1, {}) is None


def test_a_keyed_engine_refuses_calls_without_its_pools_key(app, tiny_model_dir, monkeypatch,
                                                             tmp_path):
    monkeypatch.setenv(POOL_ENGINE_SECRET, SECRET)
    pool = _pool(tiny_model_dir)
    (replica,) = pool.replicas
    pid = None
    try:
        assert driver.start_replica(replica.id, wait_s=120) == "healthy"   # /health: open
        db.session.expire_all()
        pid, url = replica.pid, replica.url
        key = pool_engine_key(pool.id)
        assert _ask(url, None).status_code == 401
        assert _ask(url, pool_engine_key(pool.id + 1)).status_code == 401   # another pool's
        assert _ask(url, key).status_code == 200
        assert httpx.get(f"{url}/health").status_code == 200
        assert key not in " ".join(open(f"/proc/{pid}/cmdline").read().split("\0"))
        # the driver's LoRA calls carry the key (the engine answers 404 for a missing
        # folder, not 401)
        res = driver.load_lora(pool.id, "nope", str(tmp_path / "missing"))
        assert res[replica.id]["status"] != 401
    finally:
        driver.stop_replica(replica.id)
        if pid:
            launcher.terminate(pid, grace_s=5)


def test_no_engine_on_a_network_interface_without_a_key(app, tiny_model_dir, monkeypatch):
    monkeypatch.delenv(POOL_ENGINE_SECRET, raising=False)
    monkeypatch.setitem(app.config, "POOLS_BIND_HOST", "0.0.0.0")
    pool = _pool(tiny_model_dir)
    (replica,) = pool.replicas
    assert driver.start_replica(replica.id, wait_s=5) == "down"
    db.session.expire_all()
    assert "needs a key" in replica.last_error and POOL_ENGINE_SECRET in replica.last_error
    assert replica.pid is None


def test_the_gateway_sends_the_pools_key(app, tiny_model_dir, monkeypatch, frontier,
                                         tmp_path_factory, app_config):
    from tests.conftest import FRONTIER_KEY
    from tests.gateway.conftest import make_world
    from tests.servers import Server
    monkeypatch.setenv(POOL_ENGINE_SECRET, SECRET)
    pool = _pool(tiny_model_dir)
    (replica,) = pool.replicas
    cfg = {"REDIS_URL": app_config["REDIS_URL"], "REDIS_NAMESPACE": app_config["REDIS_NAMESPACE"],
           "GATEWAY_SNAPSHOT_POLL_S": 0.1,
           "QDRANT_PATH": str(tmp_path_factory.mktemp("keyed-gw-qdrant")),
           "GATEWAY_LEDGER_SPOOL_DIR": str(tmp_path_factory.mktemp("keyed-gw-spool"))}
    gw = Server("gateway", json.dumps(cfg), env={"SLUICE_PROVIDER_KEY_FRONTIER": FRONTIER_KEY,
                                                  POOL_ENGINE_SECRET: SECRET},
                log_dir=tmp_path_factory.mktemp("logs"))
    pid = None
    try:
        assert driver.start_replica(replica.id, wait_s=120) == "healthy"
        db.session.expire_all()
        pid = replica.pid
        world = make_world(app, gw, [replica.url], frontier.url)
        # make_world made its own pool row for tier 1: point it at the keyed pool's engine
        from app.catalog.models import Tier
        tier1 = db.session.scalar(db.select(Tier).where(Tier.name == "tier-1"))
        tier1.pool_id = pool.id
        db.session.commit()
        from tests.gateway.conftest import publish_and_wait
        publish_and_wait(gw)
        r = httpx.post(world.base_url + "/chat/completions", timeout=60,
                       headers={"authorization": f"Bearer {world.key}"},
                       json={"model": "tier-1", "max_tokens": 2,
                             "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 200 and r.headers["x-sluice-tier"] == "tier-1", r.text[:300]
    finally:
        gw.stop()
        driver.stop_replica(replica.id)
        if pid:
            launcher.terminate(pid, grace_s=5)
