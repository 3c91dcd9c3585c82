import json

import numpy as np
import pytest

from app.errors import Conflict, ValidationError
from app.extensions import db
from app.policies.service import effective_policy
from app.redis_client import keys
from app.cascade import evaluation as ev
from app.cascade import service
from app.cascade.models import RouterModel
from tests.factories import TenantFactory, UserFactory
from tests.cascade.helpers import accept_regret, traces


def test_tier_labels_rules():
    # served tier passes: it and every stronger tier pass; cheaper tiers unknown
    assert ev.tier_labels({"tier_rank": 2, "schema_valid": True}) == [None, 1, 1]
    # a fail means every cheaper tier fails too
    assert ev.tier_labels({"tier_rank": 2, "schema_valid": False}) == [0, 0, None]
    # client feedback beats schema validation
    assert ev.tier_labels({"tier_rank": 1, "schema_valid": True, "feedback": "fail"}) == [0, None, None]
    # margin-aborted tier counts as a fail; shadow judgements override
    assert ev.tier_labels({"tier_rank": 2, "schema_valid": True, "escalated_from": [1]}) == [0, 1, 1]
    assert ev.tier_labels({"tier_rank": 3, "feedback": "pass", "shadow": {"1": True}}) == [1, None, 1]
    assert ev.tier_labels({"tier_rank": 1}) == [None, None, None]
    # an exploration verdict is judged against the served answer: agreeing with a failing
    # answer fails, disagreeing with a passing (or unjudged) one fails
    assert ev.tier_labels({"tier_rank": 3, "feedback": "fail", "shadow": {"1": True}}) == [0, 0, 0]
    assert ev.tier_labels({"tier_rank": 3, "feedback": "fail", "shadow": {"1": False}}) == [0, 0, 0]
    assert ev.tier_labels({"tier_rank": 3, "feedback": "pass", "shadow": {"1": False}}) == [0, None, 1]
    assert ev.tier_labels({"tier_rank": 2, "shadow": {"1": True}}) == [1, None, None]
    assert ev.tier_labels({"tier_rank": 2, "shadow": {"1": False}}) == [0, None, None]
    # feedback as the ledger drain stores it; S05's verdict as the ledger reader passes it on
    assert ev.tier_labels({"tier_rank": 2, "feedback": {"pass": False, "note": ""}}) == [0, 0, None]
    assert ev.tier_labels({"tier_rank": 2, "schema_valid": False,
                           "feedback": {"pass": True}}) == [None, 1, 1]


def test_held_out_split_is_stable():
    ts = traces(200)
    a, b = ev.split(ts, 0.2), ev.split(list(reversed(ts)), 0.2)
    assert {t["request_id"] for t in a[1]} == {t["request_id"] for t in b[1]}
    assert 20 < len(a[1]) < 60


def test_not_enough_labels_trains_nothing(app):
    assert service.train_scope("global", traces(100)) is None
    assert db.session.scalar(db.select(db.func.count()).select_from(RouterModel)) == 0


def test_bad_scope_rejected(app):
    with pytest.raises(ValidationError):
        service.train_scope("tenant:x", traces(10))


def stored_active(redis_client, scope):
    raw = redis_client.get(keys().router_active(scope))
    return json.loads(raw) if raw else None


def test_versioning_promotion_and_publish(app, redis_client):
    t = TenantFactory()
    accept_regret(t)
    scope = f"tenant:{t.id}"
    v0 = int(redis_client.get(keys().routers_version()) or 0)

    first = service.train_scope(scope, traces(800, seed=1))
    assert (first.version, first.status) == (1, "active")
    m = first.metrics
    assert m["comparison"]["promote"] and m["held_out"]["chosen"]["relative_quality"] >= 0.99
    assert m["held_out"]["chosen"]["cost_fraction"] < 0.8  # cheaper tiers do carry traffic
    for rank in ("1", "2"):
        assert m["calibration"][rank]["auc"] > 0.85
    pub = stored_active(redis_client, scope)
    assert pub["version"] == 1 and pub["params"] == first.params
    assert int(redis_client.get(keys().routers_version())) == v0 + 1

    # a version trained on inverted labels is worse at equal cost: rejected, v1 stays
    bad = service.train_scope(scope, traces(800, seed=2, flip_train=True))
    assert (bad.version, bad.status) == (2, "rejected")
    assert "worse" in bad.metrics["comparison"]["reason"]
    assert service.active_model(scope).id == first.id
    assert stored_active(redis_client, scope)["version"] == 1

    # a sound version is not worse: it takes traffic, v1 retires
    good = service.train_scope(scope, traces(800, seed=3))
    assert good.status == "active", good.metrics["comparison"]
    db.session.refresh(first)
    assert first.status == "retired"
    assert stored_active(redis_client, scope)["version"] == 3
    assert [v.version for v in service.versions(scope)] == [3, 2, 1]

    # explicit transitions only: a rejected model never becomes active; rollback is allowed
    admin = UserFactory(role="admin")
    with pytest.raises(Conflict):
        service.activate(admin, bad.id)
    service.activate(admin, first.id)
    assert stored_active(redis_client, scope)["version"] == 1
    assert db.session.get(RouterModel, good.id).status == "retired"


def test_set_taus_for_target_updates_tenant_policy_and_snapshot(app, redis_client):
    t = TenantFactory()
    model = service.train_scope(f"tenant:{t.id}", traces(800, seed=4))
    ops = UserFactory(role="ops")   # τ is calibrated centrally: a global user sets it
    _, taus = service.set_taus_for_target(ops, model.id, 0.99)
    pol = effective_policy(t.id)
    assert (pol["router_tau_1"], pol["router_tau_2"]) == (taus["router_tau_1"], taus["router_tau_2"])
    assert taus == service.taus_for_target(model, 0.99)
    # the gateway reads policies from the snapshot: it changed without any restart
    snap = json.loads(redis_client.get(keys().snapshot_data()))
    assert snap["tenants"][str(t.id)]["policy"]["router_tau_1"] == taus["router_tau_1"]
    with pytest.raises(ValidationError):
        service.set_taus_for_target(ops, model.id, 1.2)


def test_too_few_held_out_traces_keep_a_candidate(app, monkeypatch):
    monkeypatch.setitem(app.config, "ROUTER_MIN_HELDOUT", 10_000)
    m = service.train_scope("global", traces(800, seed=9))
    assert m.status == "candidate" and not m.metrics["comparison"]["reject"]
    assert service.active_model("global") is None


def test_training_from_ledger_rows(app, redis_client):
    from app.ledger.models import LedgerEntry
    from app.cascade.traces import train_from_ledger, traces_from_ledger
    t = TenantFactory()
    accept_regret(t)
    for tr in traces(800, seed=10):
        db.session.add(LedgerEntry(
            request_id=tr["request_id"], tenant_id=t.id, workflow="wfA", tier="frontier",
            prompt_tokens=1000, completion_tokens=100,
            payload={"router_features": tr["features"], "tier_rank": 3,
                     "feedback": {"pass": True, "note": "", "at": None},
                     "shadow": tr["shadow"]}))
    db.session.add(LedgerEntry(request_id="other-wf", tenant_id=t.id, workflow="wfB",
                               payload={"router_features": [0, 0, 0, 0], "tier_rank": 1}))
    db.session.add(LedgerEntry(request_id="no-features", tenant_id=t.id, workflow="wfA",
                               payload={}))
    db.session.commit()
    assert len(traces_from_ledger(f"tenant:{t.id}:wf:wfA")) == 800
    assert len(traces_from_ledger(f"tenant:{t.id}")) == 801
    out = train_from_ledger(f"tenant:{t.id}:wf:wfA")
    assert out["trained"] and out["status"] == "active" and out["version"] == 1
    assert train_from_ledger(f"tenant:{t.id}:wf:nothing") == {
        "scope": f"tenant:{t.id}:wf:nothing", "traces": 0, "trained": False}


def test_a_tier_without_labels_is_left_out_of_the_version(app):
    """Tier 2 unlabelled (frontier_until_router: nothing served there), tier 1 labelled by
    exploration: the version learns tier 1, never routes to tier 2 (τ2 = 1.0, above any
    calibrated q), and is promoted with traffic on tier 1."""
    from app.core import router_model as rm
    t = TenantFactory()
    accept_regret(t)
    only_t1 = [{**tr, "shadow": {"1": tr["shadow"]["1"]}} for tr in traces(800, seed=11)]
    model = service.train_scope(f"tenant:{t.id}", only_t1)
    assert model is not None and model.status == "active", model.metrics["comparison"]
    tiers = {tier["rank"]: tier for tier in model.params["tiers"]}
    assert tiers[2].get("unlabelled") and not tiers[1].get("unlabelled")
    taus = {int(k): v for k, v in model.metrics["taus"].items()}
    assert taus[2] == 1.0 and taus[1] < 1.0
    shares = model.metrics["promotion"]["point"]["shares"]
    assert float(shares.get("1", shares.get(1))) > 0.2
    X = np.asarray([tr["features"] for tr in only_t1])
    chosen = {rm.route(model.params, x, taus)[0] for x in X}
    assert chosen == {1, 3}


def test_not_enough_labels_on_any_tier_trains_nothing(app, monkeypatch):
    monkeypatch.setitem(app.config, "ROUTER_MIN_LABELS", 10_000)
    assert service.train_scope("global", traces(800, seed=12)) is None
