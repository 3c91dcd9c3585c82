from datetime import datetime, timedelta, timezone

import numpy as np
import pytest

from app.core import router_model as rm
from app.core.router_features import (STRUCTURAL_NAMES, WORKFLOW_BUCKETS, feature_dim,
                                      request_features, structural_features, workflow_bucket)
from app.cascade.training import fit_router, fit_tier, uncalibrated


def params_with(q1_logit: float, q2_logit: float, dim: int = 3) -> dict:
    """Params whose tiers score a constant (coef 0) so tests set q exactly."""
    return {"format": rm.PARAMS_FORMAT, "feature_dim": dim, "fallback_rank": 3,
            "tiers": [{"rank": 1, "coef": [0.0] * dim, "intercept": q1_logit,
                       "calibration": {"kind": "none"}},
                      {"rank": 2, "coef": [0.0] * dim, "intercept": q2_logit,
                       "calibration": {"kind": "none"}}]}


def logit(p: float) -> float:
    return float(np.log(p / (1 - p)))


TAUS = {1: 0.80, 2: 0.70}


@pytest.mark.parametrize("q1,q2,want", [(0.9, 0.95, 1), (0.79, 0.95, 2), (0.79, 0.69, 3),
                                        (0.80, 0.10, 1), (0.5, 0.70, 2)])
def test_route_picks_cheapest_tier_meeting_tau(q1, q2, want):
    rank, scores = rm.route(params_with(logit(q1), logit(q2)), np.zeros(3), TAUS)
    assert rank == want
    assert scores[1] == pytest.approx(q1) and scores[2] == pytest.approx(q2)


@pytest.mark.parametrize("params,features", [
    (None, np.zeros(3)),
    ({"format": "other"}, np.zeros(3)),
    ({"format": rm.PARAMS_FORMAT, "feature_dim": 3, "tiers": [{"rank": 1}]}, np.zeros(3)),
    (params_with(5.0, 5.0), np.zeros(4)),                 # wrong dimension
    (params_with(5.0, 5.0), np.array([0.0, np.nan, 1.0])),
    (params_with(5.0, 5.0), "not a vector"),
    ({**params_with(5.0, 5.0), "tiers": [{"rank": 1, "coef": [0, 0, 0], "intercept": 1,
                                          "calibration": {"kind": "bogus"}}]}, np.zeros(3)),
])
def test_router_failure_falls_back_to_tier_2(params, features):
    d = rm.route_decision(params, features, TAUS)
    assert (d.tier_rank, d.scores, d.reason) == (2, {}, rm.S01_DEFAULT_TIER2)
    assert d.error
    assert rm.route(params, features, TAUS) == (2, {})


def test_calibration_maps():
    z = np.array([-10.0, 0.0, 10.0])
    iso = {"kind": "isotonic", "x": [-1.0, 1.0], "y": [0.2, 0.6]}
    assert rm.calibrate(iso, z).tolist() == pytest.approx([0.2, 0.4, 0.6])
    platt = {"kind": "platt", "a": 0.0, "b": 0.0}
    assert rm.calibrate(platt, z).tolist() == pytest.approx([0.5, 0.5, 0.5])


def test_cold_start_rule():
    now = datetime(2026, 12, 2, 12, tzinfo=timezone.utc)
    assert rm.frontier_first(now - timedelta(hours=47, minutes=59), now, 48)
    assert not rm.frontier_first(now - timedelta(hours=48), now, 48)
    assert rm.frontier_first(None, now, 48)
    assert not rm.frontier_first(None, now, 0)


def test_structural_features():
    f = structural_features("SELECT id FROM users WHERE x = 1; explain why and compare",
                            schema_present=True, depth=3, workflow="wf-a")
    named = dict(zip(STRUCTURAL_NAMES, f))
    assert named["schema"] == 1.0 and named["sql"] > 0 and named["multi_hop"] > 0
    assert named["depth"] > 0
    assert f[len(STRUCTURAL_NAMES) + workflow_bucket("wf-a")] == 1.0
    assert f[len(STRUCTURAL_NAMES):].sum() == 1.0
    plain = dict(zip(STRUCTURAL_NAMES, structural_features("hi", schema_present=False)))
    assert plain["sql"] == plain["code"] == plain["multi_hop"] == plain["schema"] == 0.0
    # the bucket is stable across processes (not Python's salted hash())
    assert workflow_bucket("wf-a") == workflow_bucket("wf-a") < WORKFLOW_BUCKETS
    v = request_features(np.ones(384), [{"role": "system", "content": "S"},
                                        {"role": "user", "content": "q"}], schema_present=False)
    assert v.shape == (feature_dim(),) and v[:384].sum() == 384


def synthetic(n: int, seed: int):
    """A monotone but non-logistic link: LR's balanced probabilities are miscalibrated."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 5))
    s = X @ np.array([1.5, -1.0, 0.5, 0.0, 0.0])
    p = 0.15 + 0.8 / (1 + np.exp(-3 * s))  # pass rate never below 15% nor above 95%
    y = (rng.random(n) < p).astype(int)
    return X, y


def test_calibration_improves_ece_on_held_out():
    X, y = synthetic(3000, 1)
    Xh, yh = synthetic(3000, 2)
    params = fit_router({1: (X, y)}, fallback_rank=2)
    before = rm.predict_batch(uncalibrated(params), Xh)[:, 0]
    after = rm.predict_batch(params, Xh)[:, 0]
    ece_before, ece_after = rm.ece(before, yh), rm.ece(after, yh)
    assert ece_after < 0.05 < ece_before
    assert ece_after < ece_before / 2
    # Platt (a sigmoid of the score) cannot model the 15%/95% floor and ceiling: isotonic wins
    platt = fit_router({1: (X, y)}, fallback_rank=2, calibration="platt")
    assert ece_after < rm.ece(rm.predict_batch(platt, Xh)[:, 0], yh)


def test_unweighted_reference_is_not_shifted_by_class_weights():
    def few_passes(seed):  # keep one pass in four: class weights then matter
        X, y = synthetic(3000, seed)
        keep = (y == 0) | (np.arange(len(y)) % 4 == 0)
        return X[keep], y[keep]
    X, y = few_passes(4)
    Xh, yh = few_passes(5)
    plain = fit_router({1: (X, y)}, fallback_rank=2, calibration="none", balanced=False)
    weighted = uncalibrated(fit_router({1: (X, y)}, fallback_rank=2))
    q_plain = rm.predict_batch(plain, Xh)[:, 0]
    q_weighted = rm.predict_batch(weighted, Xh)[:, 0]
    # balanced weights push every probability towards 50%: the mean q overshoots the rate
    assert abs(q_plain.mean() - yh.mean()) < 0.03 < q_weighted.mean() - yh.mean()
    assert rm.ece(q_plain, yh) < rm.ece(q_weighted, yh)


def test_exported_params_match_sklearn_ranking_and_survive_json():
    import json
    X, y = synthetic(800, 3)
    tier = fit_tier(X, y, rank=1)
    params = json.loads(json.dumps(fit_router({1: (X, y)}, fallback_rank=2)))
    q = rm.predict_batch(params, X)[:, 0]
    z = X @ np.array(tier["coef"]) + tier["intercept"]
    assert np.corrcoef(z, rm.predict_batch(uncalibrated(params), X)[:, 0])[0, 1] > 0.9
    assert np.all(np.diff(q[np.argsort(z)]) >= -1e-12)  # calibration is monotone in z


def test_single_class_tier_is_constant():
    tier = fit_tier(np.ones((10, 2)), np.ones(10, dtype=int), rank=1)
    assert tier["coef"] == [0.0, 0.0]


def test_ece_and_reliability():
    assert rm.ece([0.9] * 10, [1] * 9 + [0]) == pytest.approx(0.0)
    assert rm.ece([1.0] * 4, [0] * 4) == pytest.approx(1.0)
    bins = rm.reliability([0.05, 0.95, 0.99], [0, 1, 1], bins=10)
    assert bins[0]["count"] == 1 and bins[9]["count"] == 2 and bins[9]["pass_rate"] == 1.0


def curve_fixture():
    # 4 requests; tier 1 passes on the first two, tier 2 on the first three, frontier on all.
    labels = np.array([[1, 1, 1], [1, 1, 1], [0, 1, 1], [0, 0, 1]])
    costs = np.tile([1.0, 5.0, 50.0], (4, 1))
    Q = np.array([[0.95, 0.99], [0.85, 0.99], [0.3, 0.9], [0.1, 0.2]])
    return Q, labels, costs


def test_curve_and_choose_taus():
    Q, labels, costs = curve_fixture()
    curve = rm.cost_quality_curve(Q, [1, 2], labels, costs)
    assert all(float(p["taus"]["1"]) >= float(p["taus"]["2"]) for p in curve)
    full = rm.choose_taus(curve, 1.0)
    assert full["relative_quality"] == 1.0
    assert full["cost"] == 1 + 1 + 5 + 50  # the perfect split
    assert full["shares"] == {1: 0.5, 2: 0.25, 3: 0.25}
    assert full["cost_fraction"] == pytest.approx(57 / 200)
    cheap = rm.choose_taus(curve, 0.5)
    assert cheap["cost"] == 4.0                       # everything on tier 1: 50% quality
    assert rm.choose_taus(curve, 1.01) is None
    front = rm.pareto(curve)
    assert [p["cost"] for p in front] == sorted(p["cost"] for p in front)
    assert rm.quality_at_cost(curve, 57) == 1.0 and rm.quality_at_cost(curve, 3) == -np.inf


def test_route_batch_matches_route():
    Q, _, _ = curve_fixture()
    chosen = rm.route_batch(Q, [1, 2], TAUS, 3)
    assert chosen.tolist() == [1, 1, 2, 3]
    assert rm.decide({1: 0.85, 2: 0.1}, TAUS, 3) == 1


def test_unscaled_leading_block_is_regularised_harder():
    rng = np.random.default_rng(4)
    X, y = synthetic(1500, 5)
    noise = rng.normal(0, 0.05, size=(1500, 50))  # an "embedding" block of small pure noise
    Xn = np.hstack([noise, X])
    scaled = fit_tier(Xn, y, rank=1)
    raw = fit_tier(Xn, y, rank=1, raw_dims=50)
    # weight mass on the noise block relative to its scale, per model
    def noise_share(t):
        w = np.abs(np.array(t["coef"]))
        return (w[:50] * 0.05).sum() / ((w[:50] * 0.05).sum() + (w[50:] * X.std(0)).sum())
    assert noise_share(raw) < noise_share(scaled) / 2
