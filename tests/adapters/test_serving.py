"""What the snapshot says about adapters (built from SQL, parsed by the gateway), and the
node's hot-(un)load tasks that write where each adapter is loaded."""
from __future__ import annotations

import json

import pytest

from app.adapters import node, serving
from app.adapters.models import Adapter
from app.contract.snapshot import AdapterEntry, ShadowEntry, Snapshot, SnapshotData
from app.extensions import db
from tests.factories import PoolFactory, TenantFactory


def _adapter(tenant, pool, name: str, state: str, workflow: str = "wf", **cols) -> Adapter:
    a = Adapter(tenant_id=tenant.id, workflow=workflow, pool_id=pool.id, name=name,
                state=state, artifact_path=f"/tmp/artifacts/{name}", **cols)
    db.session.add(a)
    db.session.commit()
    return a


def test_snapshot_round_trip_with_adapters():
    entry = AdapterEntry(name="lora-b", state="canary", canary_pct=25, pool_id=3,
                         replicas_loaded=(4, 5), previous_name="lora-a",
                         previous_replicas_loaded=(4,),
                         shadow=ShadowEntry("lora-c", 50.0, 3, (5,)))
    data = SnapshotData(tenants={}, keys={}, tiers=(), pools={}, workflows={},
                        global_policy={}, version=9, adapters={"1:wf": entry})
    raw = json.loads(json.dumps(data.to_json()))
    assert raw["adapters"]["1:wf"]["shadow"] == {"name": "lora-c", "sample_pct": 50.0,
                                                 "pool_id": 3, "replicas_loaded": [5]}
    back = SnapshotData.from_json(raw)
    assert back.adapters == {"1:wf": entry}
    assert back.adapters["1:wf"]["replicas_loaded"] == (4, 5)   # reads as a mapping too
    snap = Snapshot(raw)
    assert snap.adapter(1, "wf") == entry and snap.adapter(2, "wf") is None


def test_a_snapshot_from_before_adapters_still_parses():
    raw = {"schema": 1, "version": 3, "tenants": {}, "keys": {}, "tiers": [], "pools": {},
           "workflows": {}, "global_policy": {}}
    assert SnapshotData.from_json(raw).adapters == {}
    assert Snapshot(raw).adapter(1, "wf") is None
    only_shadow = AdapterEntry.from_json({"name": None, "state": None,
                                          "shadow": {"name": "s"}})
    assert only_shadow.shadow == ShadowEntry("s", 100.0, None, ())


def test_build_snapshot_carries_serving_and_shadow_adapters(app):
    from app.snapshot.service import build_snapshot
    tenant, pool = TenantFactory(), PoolFactory()
    old = _adapter(tenant, pool, "lora-old", "promoted", canary_pct=100,
                   loaded={"11": "ok", "12": "ok"})
    _adapter(tenant, pool, "lora-new", "canary", canary_pct=25, previous_adapter_id=old.id,
             loaded={"11": "ok", "12": "HTTP 500: no memory"})
    _adapter(tenant, pool, "lora-sh", "shadow", workflow="wf2", loaded={"12": "ok"},
             shadow={"sample_pct": 10})
    _adapter(tenant, pool, "lora-p2", "promoted", workflow="wf3", canary_pct=100,
             loaded={"11": "ok"})
    for state in ("awaiting_approval", "rolled_back", "retired", "candidate"):
        _adapter(tenant, pool, f"lora-{state}", state, workflow="wf3", loaded={"11": "ok"})
    adapters = Snapshot(build_snapshot()).adapters
    t = tenant.id
    assert set(adapters) == {f"{t}:wf", f"{t}:wf2", f"{t}:wf3"}
    assert adapters[f"{t}:wf"] == AdapterEntry(
        name="lora-new", state="canary", canary_pct=25, pool_id=pool.id,
        replicas_loaded=(11,), previous_name="lora-old", previous_replicas_loaded=(11, 12))
    assert adapters[f"{t}:wf2"] == AdapterEntry(
        name=None, state=None, canary_pct=0, pool_id=pool.id,
        shadow=ShadowEntry("lora-sh", 10.0, pool.id, (12,)))
    assert adapters[f"{t}:wf3"] == AdapterEntry(
        name="lora-p2", state="promoted", canary_pct=100, pool_id=pool.id,
        replicas_loaded=(11,))


def test_shadow_sample_defaults_to_config(app, monkeypatch):
    monkeypatch.setitem(app.config, "ADAPTERS_SHADOW_SAMPLE_PCT", 40)
    tenant, pool = TenantFactory(), PoolFactory()
    a = _adapter(tenant, pool, "lora-s", "shadow")
    assert serving.sample_pct(a) == 40.0
    a.shadow = {"sample_pct": 100, "requests": 3}
    assert serving.sample_pct(a) == 100.0


# --- the node's tasks -----------------------------------------------------------------

@pytest.fixture()
def fake_driver(monkeypatch):
    """workers.pools.driver's LoRA calls, answering per replica id as the test says."""
    from workers.pools import driver
    calls, answers = [], {}

    def load_lora(pool_id, name, path):
        calls.append(("load", pool_id, name, path))
        return answers["load"]

    def unload_lora(pool_id, name):
        calls.append(("unload", pool_id, name))
        return answers["unload"]
    monkeypatch.setattr(driver, "load_lora", load_lora)
    monkeypatch.setattr(driver, "unload_lora", unload_lora)
    return calls, answers


def test_load_writes_each_replica_and_publishes(app, fake_driver, monkeypatch):
    calls, answers = fake_driver
    published = []
    monkeypatch.setattr(node, "publish_after_commit", lambda: published.append(1))
    tenant, pool = TenantFactory(), PoolFactory()
    a = _adapter(tenant, pool, "lora-l", "canary", canary_pct=5)
    answers["load"] = {21: {"ok": True, "status": 200, "detail": "loaded"},
                       22: {"ok": False, "status": 500, "detail": "CUDA out of memory"},
                       23: {"ok": False, "status": None, "detail": "unreachable: ConnectError"}}
    out = node.load_adapter(a.id)
    assert calls == [("load", pool.id, "lora-l", "/tmp/artifacts/lora-l")]
    assert out == {"21": "ok", "22": "HTTP 500: CUDA out of memory",
                   "23": "unreachable: ConnectError"}
    db.session.expire_all()
    a = db.session.get(Adapter, a.id)
    assert a.loaded == out and "22: HTTP 500" in a.error and published == [1]
    assert serving.loaded_replicas(a) == (21,)   # only there does the gateway send it

    answers["unload"] = {21: {"ok": True, "status": 200, "detail": ""},
                         22: {"ok": False, "status": 503, "detail": "busy"}}
    node.unload_adapter(a.id)
    db.session.expire_all()
    a = db.session.get(Adapter, a.id)
    assert a.loaded == {"22": "unload failed: HTTP 503: busy",
                        "23": "unreachable: ConnectError"}
    assert serving.loaded_replicas(a) == () and published == [1, 1]


def test_node_tasks_are_registered_under_their_names(app):
    from workers.tasks import adapters as tasks
    names = set(app.extensions["celery"].tasks)
    assert {"adapters.load", "adapters.unload", "adapters.shadow_rollup"} <= names
    assert tasks.load.name == "adapters.load" and tasks.unload.name == "adapters.unload"


def test_load_task_runs_the_node_function(app, fake_driver, monkeypatch):
    from workers.tasks import adapters as tasks
    calls, answers = fake_driver
    monkeypatch.setattr(node, "publish_after_commit", lambda: None)
    tenant, pool = TenantFactory(), PoolFactory()
    a = _adapter(tenant, pool, "lora-t", "canary", canary_pct=5)
    answers["load"] = {31: {"ok": True, "status": 200, "detail": ""}}
    assert tasks.load.run(a.id) == {"31": "ok"}
