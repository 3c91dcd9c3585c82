"""τ on promotion (issue 24): a promoted router version carries the τ whose 95% upper bound
on held-out regret stays within the scope's ``router_max_regret``, published with it and used
by S01 over the policy's; a version that cannot meet the bound is not promoted and says why."""
from __future__ import annotations

import asyncio
import json
import math

import numpy as np
import pytest

from app.cascade import evaluation as ev
from app.cascade import regret, service
from app.contract.routers import PublishedRouters
from app.core import router_model as rm
from app.redis_client import keys
from tests.cascade.helpers import accept_regret, traces
from tests.factories import TenantFactory, UserFactory

NAN = math.nan


# --- the bound (pure) ---------------------------------------------------------------------

def test_clopper_pearson_upper_bound():
    # no failure in n: the exact one-sided bound is 1 - (1 - c)^(1/n)
    assert regret.clopper_pearson_upper(0, 100, 0.95) == pytest.approx(1 - 0.05 ** (1 / 100))
    assert regret.clopper_pearson_upper(0, 0, 0.95) == 1.0
    assert regret.clopper_pearson_upper(5, 100, 0.95) > 0.05
    assert regret.clopper_pearson_upper(5, 1000, 0.95) < regret.clopper_pearson_upper(5, 100, 0.95)


def test_regret_counts_cheaper_tier_fails_where_the_frontier_passes():
    labels = np.array([
        [0, 1, 1],      # tier 1 fails, frontier passes: regret when routed to tier 1
        [0, 0, 0],      # everything fails: no regret
        [1, 1, 1],
        [0, NAN, NAN],  # frontier unknown: counted as a pass (the bound errs high)
        [NAN, 1, 1],    # tier 1 unknown: not judged
        [1, 0, 1],
    ])
    all_to_one = regret.regret_bound(np.ones(6, dtype=int), labels, 0.95)
    tier1 = all_to_one["tiers"]["1"]
    assert (tier1["share"], tier1["known"], tier1["fails"]) == (1.0, 5, 2)
    assert all_to_one["estimate"] == pytest.approx(2 / 5)
    assert all_to_one["bound"] == pytest.approx(regret.clopper_pearson_upper(2, 5, 0.975))
    # the frontier's share has no regret; tier 2 gets the last two rows (one known fail)
    mixed = regret.regret_bound(np.array([3, 3, 3, 3, 2, 2]), labels, 0.95)
    assert mixed["tiers"]["1"]["share"] == 0 and mixed["tiers"]["2"]["fails"] == 1
    assert mixed["estimate"] == pytest.approx(2 / 6 * 1 / 2)
    assert mixed["bound"] == pytest.approx(2 / 6 * regret.clopper_pearson_upper(1, 2, 0.975))
    # a tier that gets requests none of whose labels is known promises nothing
    blind = regret.regret_bound(np.array([1, 3, 3, 3, 1, 3]), np.array(
        [[NAN, 1, 1]] * 6), 0.95)
    assert blind["bound"] == pytest.approx(2 / 6)
    assert regret.regret_bound(np.full(6, 3), labels, 0.95)["bound"] == 0.0


# --- promotion ----------------------------------------------------------------------------

def _held_out(model, ts):
    _, test = ev.split(ts, 0.2)
    X, labels, costs = ev.evaluation_arrays(test, service.DEFAULT_PRICES)
    return rm.predict_batch(rm.load(model.params), X), labels, costs


def test_promotion_sets_tau_that_holds_the_regret_bound(app, redis_client):
    t = TenantFactory()
    ts = traces(3000, seed=11)
    model = service.train_scope(f"tenant:{t.id}", ts)
    assert model.status == "active", model.metrics["comparison"]
    assert service.scope_policy(f"tenant:{t.id}")["router_max_regret"] == 0.008
    taus = model.metrics["taus"]
    assert taus and set(taus) == {"1", "2"}
    # recomputed from the held-out traces at the promoted τ: within the bound, at target
    Q, labels, costs = _held_out(model, ts)
    at = {int(k): v for k, v in taus.items()}
    chosen = rm.route_batch(Q, (1, 2), at, 3)
    bound = regret.regret_bound(chosen, labels, 0.95)
    assert bound["bound"] <= 0.008
    assert rm.operating_point(chosen, labels, costs)["relative_quality"] >= 0.99
    assert rm.operating_point(chosen, labels, costs)["cost_fraction"] < 0.5  # it saves money
    assert model.metrics["promotion"]["point"]["regret"]["bound"] == pytest.approx(bound["bound"])
    # the policy defaults would reach the quality point estimate but not the bound
    defaults = rm.route_batch(Q, (1, 2), {1: 0.8, 2: 0.7}, 3)
    assert regret.regret_bound(defaults, labels, 0.95)["bound"] > 0.008

    # published with the version; the gateway's side reads them for the scope's requests
    entry = json.loads(redis_client.get(keys().router_active(f"tenant:{t.id}")))
    assert entry["taus"] == taus
    routers = PublishedRouters()
    routers.refresh(redis_client, keys().ns)
    assert routers.taus(t.id, "any-workflow") == at
    assert routers.taus(t.id + 10_000, None) is None


def test_promotion_refused_when_the_bound_cannot_be_met(app, redis_client, client):
    t = TenantFactory()
    scope = f"tenant:{t.id}"
    accept_regret(t, 0.05)
    ts = traces(800, seed=12)
    first = service.train_scope(scope, ts)
    assert first.status == "active" and first.metrics["taus"]
    published = json.loads(redis_client.get(keys().router_active(scope)))

    # the tenant tightens the bound and the scope retrains (on the same traces: not worse
    # than the active version): ~160 held-out rows cannot promise 0.8% at 95%
    from app.policies.service import update_policy
    update_policy(UserFactory(role="admin"), t.id, {"router_max_regret": 0.008})
    second = service.train_scope(scope, ts)
    assert second.status == "candidate" and second.metrics["taus"] is None
    reason = second.metrics["comparison"]["reason"]
    assert reason.startswith("not promoted: no τ meets regret ≤ 0.80% at 95% confidence")
    closest = second.metrics["promotion"]["closest"]
    assert closest["regret"]["bound"] > 0.008
    # the active version and what the gateways hold did not move
    assert service.active_model(scope).id == first.id
    assert json.loads(redis_client.get(keys().router_active(scope))) == published

    # the reason is shown where versions are: the console and the admin API
    from app.auth.service import create_admin_token
    from tests.cascade.test_views import login
    ops = UserFactory(role="ops", tenant=t)
    login(client, ops)
    html = client.get(f"/router/scope/{scope}").text
    assert "not promoted: no τ meets regret ≤ 0.80%" in html
    own = first.metrics["taus"]
    assert f"τ1 {own['1']:.2f} · τ2 {own['2']:.2f}" in html
    _, token = create_admin_token(ops, "ci")
    models = client.get(f"/api/v1/router/scopes/{scope}/models",
                        headers={"Authorization": f"Bearer {token}"}).get_json()["models"]
    by_version = {m["version"]: m for m in models}
    assert by_version[2]["metrics"]["comparison"]["reason"] == reason
    assert by_version[2]["metrics"]["promotion"]["max_regret"] == 0.008
    assert by_version[1]["metrics"]["taus"] == first.metrics["taus"]


def test_gateway_uses_the_versions_tau_over_the_policys():
    from tests.gateway.test_cascade import route, routed_ctx, router_params
    params = router_params(0.75, 0.9)
    # q1 = 0.75 < policy τ1 0.80: tier 2 at the policy's τ ...
    ctx = routed_ctx(params)
    ctx.embedding = np.zeros(384, dtype=np.float32)
    assert route(ctx) == "tier-2"
    # ... tier 1 when the version was promoted with τ1 = 0.70
    ctx = routed_ctx(params)
    ctx.services.routers.update("tenant:1", json.dumps(
        {"version": 2, "params": params, "taus": {"1": 0.70, "2": 0.70}}))
    ctx.embedding = np.zeros(384, dtype=np.float32)
    assert route(ctx) == "tier-1"


def test_tau_set_by_hand_goes_to_the_version_and_is_republished(app, redis_client):
    t = TenantFactory()
    scope = f"tenant:{t.id}"
    accept_regret(t, 0.05)
    model = service.train_scope(scope, traces(800, seed=14))
    assert model.status == "active"
    _, taus = service.set_taus_for_target(UserFactory(role="ops"), model.id, 0.95)
    want = {"1": taus["router_tau_1"], "2": taus["router_tau_2"]}
    assert service.model_taus(service.get_model(None, model.id)) == want
    assert json.loads(redis_client.get(keys().router_active(scope)))["taus"] == want


def _failing_cheap_tiers(n: int, seed: int) -> list[dict]:
    """Traces of a scope whose cheaper tiers fail most of what they get (the replay's
    stand-ins: SmolLM2 on tier 2 passed 4%), served and passed by the frontier."""
    out = traces(n, seed=seed, prefix="bad")
    rng = np.random.default_rng(seed)
    for t in out:
        t["shadow"] = {"1": bool(rng.random() < 0.04), "2": bool(rng.random() < 0.04)}
    return out


def _shares(point: dict) -> dict[str, float]:
    return {str(k): v for k, v in point["shares"].items()}


def test_first_version_goes_frontier_only_when_no_tau_is_safe(app, redis_client, client):
    """No active version: the scope's auto traffic runs on the tier-2 default. When the
    held-out labels show no τ below the frontier is safe, the version is promoted with τ 1.0
    for tiers 1 and 2, so S01 sends every auto request to the frontier instead of tier 2;
    a later version that meets the bound replaces it."""
    t = TenantFactory()
    scope = f"tenant:{t.id}"
    ts = _failing_cheap_tiers(800, seed=15)
    first = service.train_scope(scope, ts)
    assert first.status == "active", first.metrics["comparison"]
    promotion = first.metrics["promotion"]
    assert promotion["frontier_only"] is True
    assert first.metrics["taus"] == {"1": 1.0, "2": 1.0}
    assert _shares(promotion["point"]) == {"1": 0.0, "2": 0.0, "3": 1.0}
    assert promotion["point"]["regret"]["bound"] == 0.0
    reason = first.metrics["comparison"]["reason"]
    assert reason.startswith("promoted, frontier only: no τ meets regret ≤ 0.80%"), reason
    # the default it replaces, measured on the same held-out rows, breaks the bound badly
    default = float(reason.rsplit("regret bound of ", 1)[1].split("%")[0]) / 100
    assert default > 0.5

    # the gateway's side: every score is below τ 1.0, so the frontier is chosen
    entry = json.loads(redis_client.get(keys().router_active(scope)))
    assert entry["taus"] == {"1": 1.0, "2": 1.0}
    Q, labels, costs = _held_out(first, ts)
    assert Q.max() < 1.0
    at = {int(k): v for k, v in entry["taus"].items()}
    assert set(rm.route_batch(Q, (1, 2), at, 3).tolist()) == {3}
    assert all(rm.decide({1: float(q[0]), 2: float(q[1])}, at, 3) == 3 for q in Q)

    # the console says so
    from tests.cascade.test_views import login
    login(client, UserFactory(role="ops", tenant=t))
    html = client.get(f"/router/scope/{scope}").text
    assert "frontier only" in html and "τ1 1.00 · τ2 1.00" in html

    # with an active version, a version that cannot meet the bound is not promoted
    # (no frontier fallback over a version already in service)
    second = service.train_scope(scope, _failing_cheap_tiers(800, seed=16))
    assert second.status == "candidate" and second.metrics["taus"] is None
    assert second.metrics["promotion"]["frontier_only"] is False
    assert service.active_model(scope).id == first.id

    # the cheaper tiers now pass (labels from exploration): a version that meets the bound
    # replaces the frontier-only one and sends traffic below the frontier again
    third = service.train_scope(scope, traces(3000, seed=11))
    assert third.status == "active", third.metrics["comparison"]
    assert third.metrics["comparison"]["reason"] == "replaces a frontier-only version"
    assert third.metrics["promotion"]["frontier_only"] is False
    assert third.metrics["promotion"]["point"]["regret"]["bound"] <= 0.008
    assert _shares(third.metrics["promotion"]["point"])["3"] < 0.5
    assert service.get_model(None, first.id).status == "retired"


def test_no_frontier_fallback_when_the_bound_is_unproven_for_lack_of_labels(app):
    """Too few held-out labels to judge: no promotion of any kind (the default stays)."""
    t = TenantFactory()
    scope = f"tenant:{t.id}"
    app.config["ROUTER_MIN_HELDOUT"], before = 10_000, app.config["ROUTER_MIN_HELDOUT"]
    try:
        model = service.train_scope(scope, _failing_cheap_tiers(800, seed=17))
    finally:
        app.config["ROUTER_MIN_HELDOUT"] = before
    assert model.status == "candidate" and model.metrics["taus"] is None
    assert model.metrics["comparison"]["reason"].startswith("only ")
    assert service.active_model(scope) is None
