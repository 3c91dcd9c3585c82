"""Which scopes the beat queues for training, from ledger rows shaped as the drain writes them
(the gateway-to-ledger path itself is covered in tests/gateway/test_router_learning.py)."""
from datetime import datetime, timedelta, timezone

import pytest

from app.extensions import db
from app.ledger.models import LedgerEntry
from app.cascade.models import RouterModel
from app.cascade.schedule import due_scopes
from tests.factories import TenantFactory


@pytest.fixture()
def cfg(app, monkeypatch):
    monkeypatch.setitem(app.config, "ROUTER_MIN_LABELS", 8)  # -> 10 before the held-out 20%
    monkeypatch.setitem(app.config, "ROUTER_RETRAIN_MIN_NEW_LABELS", 5)
    return app


def add_rows(tenant_id: int, workflow: str, n: int, at: datetime, *, passed: bool | None,
             served: int = 2, features: bool = True, tag: str = "") -> None:
    for i in range(n):
        payload = {"router_features": [0.1, 0.2] if features else None, "tier_rank": served,
                   "escalated_from": None, "pipeline": {"states": [], "schema_valid": None}}
        if passed is not None:
            payload["feedback"] = {"pass": passed, "note": "", "at": at.isoformat()}
        db.session.add(LedgerEntry(request_id=f"{tenant_id}-{workflow}-{tag}-{i}",
                                   tenant_id=tenant_id, workflow=workflow, at=at, payload=payload))
    db.session.commit()


def test_due_when_a_cheaper_tier_has_enough_labels(cfg):
    t = TenantFactory()
    now = datetime.now(timezone.utc)
    wf = f"tenant:{t.id}:wf:wfA"
    # 9 tier-2 fails (tiers 1 and 2 fail): each has 9 < 10 labels
    add_rows(t.id, "wfA", 9, now - timedelta(hours=2), passed=False, tag="f")
    assert due_scopes(now) == []
    # rows without features, without a label, or outside the window do not count
    add_rows(t.id, "wfA", 5, now, passed=False, features=False, tag="nf")
    add_rows(t.id, "wfA", 5, now, passed=None, tag="nl")
    add_rows(t.id, "wfA", 5, now - timedelta(days=40), passed=False, tag="old")
    assert due_scopes(now) == []
    add_rows(t.id, "wfA", 1, now - timedelta(hours=1), passed=False, tag="f2")
    due = {d["scope"]: d for d in due_scopes(now)}
    assert set(due) == {wf, f"tenant:{t.id}"}
    assert due[wf]["tiers"] == {"1": 10, "2": 10} and due[wf]["new"] == 10


def test_due_on_tier_one_labels_alone(cfg):
    """Under frontier_until_router nothing serves tier 2, so it gets no labels while
    exploration labels tier 1: the scope is due on tier 1's (the version leaves tier 2 out)."""
    t = TenantFactory()
    now = datetime.now(timezone.utc)
    wf = f"tenant:{t.id}:wf:wfA"
    add_rows(t.id, "wfA", 12, now - timedelta(hours=2), passed=True, served=3, tag="p")
    assert due_scopes(now) == []   # frontier passes label only the frontier
    for i in range(10):
        db.session.add(LedgerEntry(
            request_id=f"{t.id}-wfA-p-{i}-explore", tenant_id=t.id, workflow="wfA", at=now,
            kind="shadow", payload={"explore": True, "shadow_of": f"{t.id}-wfA-p-{i}",
                                    "tier_rank": 1, "agreed": True, "adapter": None}))
    db.session.commit()
    due = {d["scope"]: d for d in due_scopes(now)}
    assert due[wf]["tiers"] == {"1": 10, "2": 0}


def test_retrain_waits_for_new_labels_after_the_last_version(cfg):
    t = TenantFactory()
    now = datetime.now(timezone.utc)
    wf = f"tenant:{t.id}:wf:wfA"
    add_rows(t.id, "wfA", 12, now - timedelta(hours=3), passed=False, tag="f")
    assert wf in {d["scope"] for d in due_scopes(now)}
    db.session.add(RouterModel(scope=wf, version=1, status="active", params={},
                               created_at=now - timedelta(hours=2)))
    db.session.commit()
    scopes = {d["scope"]: d for d in due_scopes(now)}
    assert wf not in scopes and f"tenant:{t.id}" in scopes  # the tenant scope has no version
    add_rows(t.id, "wfA", 4, now - timedelta(hours=1), passed=True, tag="new")
    assert wf not in {d["scope"] for d in due_scopes(now)}  # 4 new < 5
    add_rows(t.id, "wfA", 1, now - timedelta(minutes=5), passed=True, tag="new2")
    (d,) = [d for d in due_scopes(now) if d["scope"] == wf]
    assert d["new"] == 5 and d["labelled"] == 17


def test_a_promotion_makes_the_workflow_router_due_without_new_labels(cfg):
    """The version trained before tier 1 changed arm (an adapter promoted) models the base
    model on tier 1: the workflow's scope is due again at once, not after
    ROUTER_RETRAIN_MIN_NEW_LABELS more; once retrained after the change it waits again."""
    from app.adapters.models import Adapter, AdapterEvent
    t = TenantFactory()
    now = datetime.now(timezone.utc)
    wf = f"tenant:{t.id}:wf:wfA"
    add_rows(t.id, "wfA", 12, now - timedelta(hours=3), passed=False, tag="f")
    db.session.add(RouterModel(scope=wf, version=1, status="active", params={},
                               created_at=now - timedelta(hours=2)))
    db.session.commit()
    assert wf not in {d["scope"] for d in due_scopes(now)}
    a = Adapter(tenant_id=t.id, workflow="wfA", name=f"wf-{t.id}-1", state="promoted")
    db.session.add(a)
    db.session.flush()
    db.session.add(AdapterEvent(adapter_id=a.id, at=now - timedelta(hours=1), event="promote",
                                from_state="canary", to_state="promoted"))
    db.session.commit()
    assert wf in {d["scope"] for d in due_scopes(now)}
    db.session.add(RouterModel(scope=wf, version=2, status="active", params={},
                               created_at=now - timedelta(minutes=30)))
    db.session.commit()
    assert wf not in {d["scope"] for d in due_scopes(now)}
