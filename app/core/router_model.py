"""Calibrated cascade router at request time, and its held-out evaluation. Pure numpy.

``params`` is plain JSON (stored in RouterModel.params, published to Redis)::

    {"format": "sluice-router/1", "feature_dim": D, "fallback_rank": 3,
     "tiers": [{"rank": 1, "coef": [D floats], "intercept": b,
                "calibration": {"kind": "isotonic", "x": [...], "y": [...]}
                             | {"kind": "platt", "a": a, "b": b} | {"kind": "none"}}, ...]}

Per tier k: z = coef·x + intercept (standardisation is folded into coef), and
q_k = calibration(z) ≈ P(tier k meets the quality bar | x). The decision is the cheapest
tier with q_k ≥ τ_k; the fallback rank (the frontier) when none qualifies. Any failure
(no params, wrong shape, NaN) gives tier 2 with reason S01_DEFAULT_TIER2.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Mapping, Sequence

import numpy as np

PARAMS_FORMAT = "sluice-router/1"
S01_DEFAULT_TIER2 = "S01_DEFAULT_TIER2"
DEFAULT_TIER_RANK = 2
ROUTED = "router"
# Calibrated q never reaches 1, so τ = 1.0 (the policy's upper bound) switches a tier off.
Q_MAX = 0.999
TAU_GRID = tuple(round(x, 2) for x in np.linspace(0.0, 1.0, 21))  # policy bounds: 0..1


@dataclass(frozen=True)
class Router:
    """``params`` turned into arrays once (the gateway keeps one per loaded version)."""

    ranks: tuple[int, ...]
    coef: np.ndarray           # (tiers, D)
    intercept: np.ndarray      # (tiers,)
    calibrations: tuple[dict, ...]
    fallback_rank: int


@dataclass(frozen=True)
class RouteDecision:
    tier_rank: int
    scores: dict[int, float] = field(default_factory=dict)
    reason: str = ROUTED       # "router" or S01_DEFAULT_TIER2
    error: str = ""


def load(params: Mapping[str, Any]) -> Router:
    if params.get("format") != PARAMS_FORMAT:
        raise ValueError(f"unknown router params format {params.get('format')!r}")
    tiers = sorted(params["tiers"], key=lambda t: t["rank"])
    coef = np.asarray([t["coef"] for t in tiers], dtype=np.float64)
    if coef.ndim != 2 or coef.shape[1] != int(params["feature_dim"]):
        raise ValueError("coef shape does not match feature_dim")
    return Router(ranks=tuple(int(t["rank"]) for t in tiers), coef=coef,
                  intercept=np.asarray([t["intercept"] for t in tiers], dtype=np.float64),
                  calibrations=tuple(t.get("calibration") or {"kind": "none"} for t in tiers),
                  fallback_rank=int(params.get("fallback_rank", 3)))


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.clip(z, -50, 50)))


def calibrate(cal: Mapping[str, Any], z: np.ndarray) -> np.ndarray:
    """Calibrated probability from the raw decision score ``z``."""
    kind = cal.get("kind", "none")
    if kind == "isotonic":
        q = np.interp(z, cal["x"], cal["y"])
    elif kind == "platt":
        q = _sigmoid(cal["a"] * z + cal["b"])
    elif kind == "none":
        q = _sigmoid(z)
    else:
        raise ValueError(f"unknown calibration {kind!r}")
    return np.minimum(q, Q_MAX)


def predict_batch(router: Router | Mapping[str, Any], X: np.ndarray, *,
                  calibrated: bool = True) -> np.ndarray:
    """q for every row of X: shape (n, tiers), columns in ``router.ranks`` order."""
    r = router if isinstance(router, Router) else load(router)
    X = np.atleast_2d(np.asarray(X, dtype=np.float64))
    Z = X @ r.coef.T + r.intercept
    if not calibrated:
        return _sigmoid(Z)
    return np.column_stack([calibrate(c, Z[:, i]) for i, c in enumerate(r.calibrations)])


def predict(router: Router | Mapping[str, Any], features: np.ndarray) -> dict[int, float]:
    """{tier rank: calibrated q} for one request."""
    r = router if isinstance(router, Router) else load(router)
    q = predict_batch(r, features)[0]
    return {rank: float(v) for rank, v in zip(r.ranks, q)}


def decide(scores: Mapping[int, float], taus: Mapping[int, float], fallback_rank: int) -> int:
    """The cheapest tier whose q reaches its τ (a tier without τ is never chosen)."""
    for rank in sorted(scores):
        tau = taus.get(rank)
        if tau is not None and scores[rank] >= tau:
            return rank
    return fallback_rank


def route_decision(router: Router | Mapping[str, Any] | None, features: Any,
                   taus: Mapping[int, float]) -> RouteDecision:
    """Never raises: a failure is tier 2 with reason S01_DEFAULT_TIER2."""
    try:
        if router is None:
            raise ValueError("no router model")
        r = router if isinstance(router, Router) else load(router)
        x = np.asarray(features, dtype=np.float64).ravel()
        if x.shape[0] != r.coef.shape[1] or not np.all(np.isfinite(x)):
            raise ValueError(f"bad feature vector (len {x.shape[0]}, want {r.coef.shape[1]})")
        scores = predict(r, x)
        if not all(math.isfinite(v) for v in scores.values()):
            raise ValueError("non-finite router score")
        return RouteDecision(decide(scores, taus, r.fallback_rank), scores)
    except Exception as exc:  # noqa: BLE001 - S01 degrades, it never loses the request
        return RouteDecision(DEFAULT_TIER_RANK, {}, S01_DEFAULT_TIER2, str(exc)[:200])


def route(router: Router | Mapping[str, Any] | None, features: Any,
          taus: Mapping[int, float]) -> tuple[int, dict[int, float]]:
    """(tier rank, {rank: q}); scores are empty when S01_DEFAULT_TIER2 was taken."""
    d = route_decision(router, features, taus)
    return d.tier_rank, d.scores


def taus_from_policy(policy: Mapping[str, Any]) -> dict[int, float]:
    return {1: float(policy["router_tau_1"]), 2: float(policy["router_tau_2"])}


def frontier_first(first_seen_at: datetime | None, now: datetime, hours: float) -> bool:
    """Cold start: a workflow younger than ``hours`` (or never seen) goes to the frontier."""
    if first_seen_at is None:
        return hours > 0
    return now - first_seen_at < timedelta(hours=hours)


# ---- held-out evaluation --------------------------------------------------------------

def reliability(probs: Sequence[float], labels: Sequence[int], bins: int = 10) -> list[dict]:
    """Equal-width reliability bins: mean predicted q vs observed pass rate."""
    p = np.asarray(probs, dtype=np.float64)
    y = np.asarray(labels, dtype=np.float64)
    idx = np.minimum((p * bins).astype(int), bins - 1)
    out = []
    for b in range(bins):
        sel = idx == b
        n = int(sel.sum())
        out.append({"lo": b / bins, "hi": (b + 1) / bins, "count": n,
                    "mean_q": float(p[sel].mean()) if n else None,
                    "pass_rate": float(y[sel].mean()) if n else None})
    return out


def ece(probs: Sequence[float], labels: Sequence[int], bins: int = 10) -> float:
    """Expected calibration error: count-weighted |mean q − pass rate| over the bins."""
    rows = reliability(probs, labels, bins)
    n = sum(r["count"] for r in rows)
    if not n:
        return math.nan
    return sum(r["count"] * abs(r["mean_q"] - r["pass_rate"]) for r in rows if r["count"]) / n


def route_batch(Q: np.ndarray, ranks: Sequence[int], taus: Mapping[int, float],
                fallback_rank: int) -> np.ndarray:
    """The tier rank chosen for every row of Q (columns in ``ranks`` order)."""
    chosen = np.full(Q.shape[0], fallback_rank, dtype=int)
    undecided = np.ones(Q.shape[0], dtype=bool)
    for j, rank in enumerate(ranks):
        hit = undecided & (Q[:, j] >= taus.get(rank, math.inf))
        chosen[hit] = rank
        undecided &= ~hit
    return chosen


def _tier_quality(labels: np.ndarray, sel: np.ndarray, col: int) -> float:
    """Pass rate of tier ``col`` over the rows ``sel`` routed to it, from the rows whose
    label for that tier is known (NaN = unknown); the tier's known rate over all rows when
    none of them is known, 0 when nothing at all is known of the tier."""
    y = labels[sel, col]
    y = y[~np.isnan(y)]
    if len(y):
        return float(y.mean())
    y = labels[:, col]
    y = y[~np.isnan(y)]
    return float(y.mean()) if len(y) else 0.0


def operating_point(chosen: np.ndarray, labels: np.ndarray, costs: np.ndarray) -> dict:
    """Quality and cost of a routing. ``labels``/``costs``: (n, tiers incl. frontier), column
    r-1 for rank r; quality is relative to always-frontier, cost to the frontier's cost.

    Labels may be NaN (unknown: product traces label only some tiers of a request). Each
    tier is then judged on its own known labels: quality = sum over tiers of (share of
    rows routed there) x (pass rate of the routed rows whose label for that tier is
    known). With every label known this is the plain mean of the chosen tiers' labels."""
    chosen = np.asarray(chosen, dtype=int)
    labels = np.asarray(labels, dtype=np.float64)
    n_tiers = labels.shape[1]
    shares, q, evaluated = {}, 0.0, {}
    for r in range(1, n_tiers + 1):
        sel = chosen == r
        shares[r] = float(sel.mean()) if len(chosen) else 0.0
        evaluated[r] = int((sel & ~np.isnan(labels[:, r - 1])).sum())
        if shares[r]:
            q += shares[r] * _tier_quality(labels, sel, r - 1)
    rows = np.arange(len(chosen))
    c = float(costs[rows, chosen - 1].sum())
    fq = _tier_quality(labels, np.ones(len(chosen), dtype=bool), n_tiers - 1) or 1.0
    fc = float(costs[:, -1].sum()) or 1.0
    return {"quality": q, "relative_quality": q / fq, "cost": c, "cost_fraction": c / fc,
            "shares": shares, "evaluated": evaluated}


def never_taus(params: Mapping[str, Any]) -> dict[int, float]:
    """τ 1.0 for the tiers a version learned nothing about (``"unlabelled"``: too few
    labels when it was trained): calibrated q stays below 1 (``Q_MAX``), so they are never
    chosen."""
    return {int(t["rank"]): 1.0 for t in params.get("tiers") or () if t.get("unlabelled")}


def tau_vectors(ranks: Sequence[int], grid: Sequence[float] = TAU_GRID,
                fixed: Mapping[int, float] | None = None):
    """Every τ vector on the grid, τ non-increasing with rank (as the policy requires)
    among the ranks not in ``fixed``; a rank in ``fixed`` keeps its value."""
    fixed = fixed or {}
    free = [r for r in ranks if r not in fixed]
    for combo in itertools.product(grid, repeat=len(free)):
        if any(a < b for a, b in zip(combo, combo[1:])):
            continue
        yield {r: fixed[r] if r in fixed else combo[free.index(r)] for r in ranks}


def cost_quality_curve(Q: np.ndarray, ranks: Sequence[int], labels: np.ndarray,
                       costs: np.ndarray, grid: Sequence[float] = TAU_GRID,
                       fixed: Mapping[int, float] | None = None) -> list[dict]:
    """One operating point per τ vector on the grid (``tau_vectors``), sorted by cost."""
    fallback = labels.shape[1]
    points = []
    for taus in tau_vectors(ranks, grid, fixed):
        pt = operating_point(route_batch(Q, ranks, taus, fallback), labels, costs)
        pt["taus"] = {str(k): v for k, v in taus.items()}
        points.append(pt)
    points.sort(key=lambda p: (p["cost"], -p["quality"]))
    return points


def pareto(curve: Sequence[Mapping[str, Any]]) -> list[dict]:
    """The points no cheaper point beats on quality (the curve drawn in the console)."""
    out, best = [], -math.inf
    for p in sorted(curve, key=lambda p: (p["cost"], -p["quality"])):
        if p["quality"] > best:
            out.append(dict(p))
            best = p["quality"]
    return out


def choose_taus(curve: Sequence[Mapping[str, Any]], quality_target: float) -> dict | None:
    """The cheapest point whose relative quality reaches ``quality_target`` (0.99 = 99% of
    frontier quality); ties on cost go to the higher quality. None if no point does."""
    ok = [p for p in curve if p["relative_quality"] >= quality_target - 1e-12]
    if not ok:
        return None
    return dict(min(ok, key=lambda p: (p["cost"], -p["quality"])))


def quality_at_cost(curve: Sequence[Mapping[str, Any]], cost: float) -> float:
    """Best quality among the points costing at most ``cost`` (−inf if none)."""
    ok = [p["quality"] for p in curve if p["cost"] <= cost * (1 + 1e-9)]
    return max(ok) if ok else -math.inf
