"""τ for a router version from the seed's regret bound, E[Regret] ≤ router_max_regret. Pure.

Regret of a routing is the share of requests sent to a cheaper tier that fails where the
frontier would pass. On held-out traces (labels may be unknown, NaN):

    regret = Σ_k<K  s_k · r_k

where s_k is the share of held-out requests routed to tier k and r_k the rate, among the
requests routed to tier k whose tier-k label is known, of "tier k fails and the frontier
is not known to fail" (an unknown frontier label counts as a pass: the bound errs high).
Each r_k is bounded above by Clopper-Pearson at confidence 1 - (1 - c) / (K - 1) (the
tiers' bounds then hold together with confidence c, Bonferroni); a tier that receives
requests none of whose labels is known is bounded by 1. The routing's bound is
Σ s_k · upper(r_k); the frontier's own share adds nothing (it has no regret by definition).

``choose`` walks the τ grid (τ non-increasing with rank, as the policy requires) and takes
the cheapest point whose bound is within ``max_regret`` and whose held-out relative quality
reaches the quality target, among the points that send anything below the frontier (all
traffic to the frontier needs no router). None, with the closest miss, when no point does:
the version is then not promoted, unless the scope has no active version: its traffic
then runs on the tier-2 default, and the all-frontier point replaces it (``frontier_fallback``).
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np
from scipy.stats import beta

from app.core import router_model as rm


def clopper_pearson_upper(failures: int, n: int, confidence: float) -> float:
    """One-sided upper bound of a binomial proportion at ``confidence``; 1 when n = 0."""
    if n <= 0 or failures >= n:
        return 1.0
    return float(beta.ppf(confidence, failures + 1, n - failures))


def regret_bound(chosen: np.ndarray, labels: np.ndarray, confidence: float) -> dict[str, Any]:
    """The regret estimate and its upper bound of one routing (``chosen``: rank per row;
    ``labels``: (n, K) with NaN for unknown, column r-1 for rank r)."""
    chosen = np.asarray(chosen, dtype=int)
    labels = np.asarray(labels, dtype=np.float64)
    n_rows, n_tiers = labels.shape
    per_tier_conf = 1.0 - (1.0 - confidence) / max(1, n_tiers - 1)
    frontier = labels[:, n_tiers - 1]
    bound = estimate = 0.0
    tiers = {}
    for r in range(1, n_tiers):
        sel = chosen == r
        share = float(sel.mean()) if n_rows else 0.0
        lab, front = labels[sel, r - 1], frontier[sel]
        known = ~np.isnan(lab)
        n = int(known.sum())
        fails = int(((lab[known] == 0) & (front[known] != 0)).sum())
        upper = clopper_pearson_upper(fails, n, per_tier_conf) if share else 0.0
        rate = fails / n if n else (math.nan if share else 0.0)
        bound += share * upper
        estimate += share * (0.0 if math.isnan(rate) else rate)
        tiers[str(r)] = {"share": share, "known": n, "fails": fails, "upper": upper}
    return {"bound": bound, "estimate": estimate, "confidence": confidence, "tiers": tiers}


def _points(Q: np.ndarray, ranks: Sequence[int], labels: np.ndarray, costs: np.ndarray,
            confidence: float, grid: Sequence[float], fixed: dict[int, float] | None = None):
    fallback = labels.shape[1]
    for taus in rm.tau_vectors(ranks, grid, fixed):
        chosen = rm.route_batch(Q, ranks, taus, fallback)
        point = rm.operating_point(chosen, labels, costs)
        point["taus"] = {str(k): v for k, v in taus.items()}
        point["regret"] = regret_bound(chosen, labels, confidence)
        yield point


def frontier_only(labels: np.ndarray, costs: np.ndarray, ranks: Sequence[int],
                  confidence: float) -> dict[str, Any]:
    """The operating point that sends every request to the frontier: τ = 1.0 for every
    cheaper tier (calibrated q stays below 1, ``rm.Q_MAX``), regret 0 by definition."""
    chosen = np.full(len(labels), labels.shape[1], dtype=int)
    point = rm.operating_point(chosen, labels, costs)
    point["taus"] = {str(r): 1.0 for r in ranks}
    point["regret"] = regret_bound(chosen, labels, confidence)
    point["frontier_only"] = True
    return point


def choose(params: dict, X: np.ndarray, labels: np.ndarray, costs: np.ndarray, *,
           quality_target: float, max_regret: float, confidence: float,
           grid: Sequence[float] = rm.TAU_GRID,
           frontier_fallback: bool = False) -> dict[str, Any]:
    """{"point": the cheapest operating point meeting both the quality target and the
    regret bound (None when none does), "closest": the lowest-bound point that routes
    below the frontier, "reason": why, in words}.

    With ``frontier_fallback`` (the scope has no active version, so its auto traffic runs on
    the tier-2 default, S01_DEFAULT_TIER2), a scope where no τ below the frontier meets the
    rule gets the all-frontier point instead of None: the held-out labels have just shown
    that the cheaper tiers cannot be trusted with its traffic, and the default would keep
    sending it to tier 2. Its regret is 0; exploration keeps labelling the cheaper tiers, so
    a later version can bring traffic back below the frontier once it meets the bound."""
    rule = (f"regret ≤ {max_regret:.2%} at {confidence:.0%} confidence and "
            f"≥ {quality_target:.1%} of frontier quality")
    if not len(X):
        return {"point": None, "closest": None, "reason": "no labelled held-out traces"}
    router = rm.load(params)
    Q = rm.predict_batch(router, X)
    below = [p for p in _points(Q, router.ranks, labels, costs, confidence, grid,
                                rm.never_taus(params))
             if p["shares"][labels.shape[1]] < 1.0]
    ok = [p for p in below if p["regret"]["bound"] <= max_regret + 1e-12
          and p["relative_quality"] >= quality_target - 1e-12]
    closest = min(below, key=lambda p: (p["regret"]["bound"], p["cost"]), default=None)
    if ok:
        point = min(ok, key=lambda p: (p["cost"], -p["quality"]))
        return {"point": point, "closest": closest,
                "reason": f"τ1 {point['taus']['1']:.2f}, τ2 {point['taus']['2']:.2f}: "
                          f"regret bound {point['regret']['bound']:.2%} ({rule})"}
    if closest is None:
        return {"point": None, "closest": None,
                "reason": f"no τ sends any request below the frontier ({rule})"}
    b = closest["regret"]
    weakest = max(b["tiers"].items(), key=lambda kv: kv[1]["share"] * kv[1]["upper"])
    miss = (f"no τ meets {rule}: the lowest bound below the frontier is "
            f"{b['bound']:.2%} (τ1 {closest['taus']['1']:.2f}, τ2 "
            f"{closest['taus']['2']:.2f}; tier {weakest[0]} gets "
            f"{weakest[1]['share']:.1%} of requests on {weakest[1]['known']} known "
            f"labels, {weakest[1]['fails']} failing)")
    if frontier_fallback:
        default = regret_bound(np.full(len(X), rm.DEFAULT_TIER_RANK), labels, confidence)
        return {"point": frontier_only(labels, costs, router.ranks, confidence),
                "closest": closest,
                "reason": f"frontier only: {miss}; the tier-2 default it replaces has a "
                          f"regret bound of {default['bound']:.2%} "
                          f"({default['estimate']:.1%} measured)"}
    return {"point": None, "closest": closest, "reason": miss}
