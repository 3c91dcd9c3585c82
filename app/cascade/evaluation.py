"""From product traces to per-tier labels, and the held-out evaluation of a router. Pure.

A trace is a plain dict, one per served request, as the ledger can supply it::

    {"request_id": "r-1",
     "features": [...],                 # the S01 feature vector the gateway logged
     "tier_rank": 1,                    # the tier whose answer was served
     "prompt_tokens": 420, "completion_tokens": 60,   # or "costs": {"1": usd, "2": .., "3": ..}
     "schema_valid": True | False | None,   # S05 validation of the output against the schema
     "feedback": {"pass": bool, ...} | "pass" | "fail" | None,  # POST /v1/feedback
     "shadow": {"1": True, "2": False},     # tier k's off-path answer agreed with the served one
     "escalated_from": [1]}                 # tiers the margin monitor aborted

Label rules (stated, so they can be argued with): the served tier's outcome is the
client's feedback when given, else schema validity. A pass implies every higher tier
passes and a fail implies every lower tier fails (tiers are ordered by strength). A tier
the margin monitor aborted counts as a fail. A shadow verdict (the gateway's tier-1
exploration: that tier answered the same request off the path, compared with the served
answer) overrides all of that for its tier, with the served answer as the reference: when
the served answer passed or was not judged, agreeing is a pass and disagreeing a fail;
when it is known to have failed, agreeing is a fail and disagreeing adds nothing. Tiers
nothing is known about stay None and are left out of that tier's training set.
"""
from __future__ import annotations

import hashlib
import math
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from app.core import router_model as rm


def feedback_verdict(fb: Any) -> bool | None:
    """The client's verdict as the ledger drain stores it (``{"pass": bool, "note", "at"}``),
    or the plain "pass"/"fail" string; None when there is none."""
    if isinstance(fb, Mapping):
        fb = fb.get("pass")
    if isinstance(fb, bool):
        return fb
    if fb in ("pass", "fail"):
        return fb == "pass"
    return None


def outcome(trace: Mapping[str, Any]) -> bool | None:
    verdict = feedback_verdict(trace.get("feedback"))
    if verdict is not None:
        return verdict
    sv = trace.get("schema_valid")
    return None if sv is None else bool(sv)


def tier_labels(trace: Mapping[str, Any], n_tiers: int = 3) -> list[int | None]:
    """Label per tier (index rank-1): 1 meets the bar, 0 does not, None unknown."""
    labels: list[int | None] = [None] * n_tiers
    served = int(trace.get("tier_rank") or 0)
    ok = outcome(trace)
    if 1 <= served <= n_tiers and ok is not None:
        span = range(served, n_tiers + 1) if ok else range(1, served + 1)
        for r in span:
            labels[r - 1] = int(ok)
    for r in trace.get("escalated_from") or ():
        if 1 <= int(r) <= n_tiers:
            for lower in range(1, int(r) + 1):
                labels[lower - 1] = 0
    for r, agreed in (trace.get("shadow") or {}).items():
        if not 1 <= int(r) <= n_tiers or agreed is None:
            continue
        if ok is False and 1 <= served <= n_tiers:   # the reference itself failed
            if agreed:
                labels[int(r) - 1] = 0
        else:
            labels[int(r) - 1] = int(bool(agreed))
    return labels


def held_out(request_id: str, fraction: float) -> bool:
    """Stable held-out membership by request id (the same split on every retrain)."""
    h = int.from_bytes(hashlib.blake2b(request_id.encode(), digest_size=8).digest(), "big")
    return h / 2**64 < fraction


def split(traces: Sequence[Mapping], fraction: float) -> tuple[list, list]:
    train, test = [], []
    for t in traces:
        (test if held_out(str(t["request_id"]), fraction) else train).append(t)
    return train, test


def training_sets(traces: Iterable[Mapping], ranks: Sequence[int],
                  n_tiers: int = 3) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """rank -> (X, y) over the traces whose label for that tier is known."""
    rows: dict[int, tuple[list, list]] = {r: ([], []) for r in ranks}
    for t in traces:
        labels = tier_labels(t, n_tiers)
        for r in ranks:
            if labels[r - 1] is not None:
                rows[r][0].append(t["features"])
                rows[r][1].append(labels[r - 1])
    return {r: (np.asarray(x, dtype=np.float64), np.asarray(y, dtype=int))
            for r, (x, y) in rows.items() if y}


def trace_costs(trace: Mapping[str, Any], prices: Mapping[int, tuple[float, float]],
                n_tiers: int = 3) -> list[float]:
    """USD per tier for this request: given costs, else tokens x (input, output) $/1M."""
    given = trace.get("costs")
    if given:
        return [float(given.get(str(r), given.get(r, math.nan))) for r in range(1, n_tiers + 1)]
    pin, pout = int(trace.get("prompt_tokens") or 0), int(trace.get("completion_tokens") or 0)
    return [(pin * prices[r][0] + pout * prices[r][1]) / 1e6 for r in range(1, n_tiers + 1)]


def evaluation_arrays(traces: Iterable[Mapping], prices: Mapping[int, tuple[float, float]],
                      n_tiers: int = 3) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(X, labels, costs) over the traces with at least one tier's label known; unknown
    labels are NaN. Keeping only fully labelled traces would keep just the served-by-tier-1
    passes and the frontier fails (a biased sample); instead every tier is judged on the
    rows where its own label is known (app.core.router_model.operating_point)."""
    X, L, C = [], [], []
    for t in traces:
        labels = tier_labels(t, n_tiers)
        if all(v is None for v in labels):
            continue
        X.append(t["features"])
        L.append([math.nan if v is None else float(v) for v in labels])
        C.append(trace_costs(t, prices, n_tiers))
    if not X:
        return np.zeros((0, 0)), np.zeros((0, n_tiers)), np.zeros((0, n_tiers))
    return np.asarray(X, dtype=np.float64), np.asarray(L, dtype=np.float64), \
        np.asarray(C, dtype=float)


def known_labels(labels: np.ndarray) -> dict[str, int]:
    """How many held-out labels each tier is judged on."""
    return {str(r + 1): int((~np.isnan(labels[:, r])).sum()) for r in range(labels.shape[1])}


def _auc(q: np.ndarray, y: np.ndarray) -> float | None:
    if len(set(y.tolist())) < 2:
        return None
    from sklearn.metrics import roc_auc_score
    return float(roc_auc_score(y, q))


def calibration_report(params: Mapping, per_tier: Mapping[int, tuple[np.ndarray, np.ndarray]],
                       bins: int = 10) -> dict[str, dict]:
    """Per tier on held-out rows: ECE before/after calibration, AUC, reliability diagram."""
    from app.cascade.training import uncalibrated
    router, raw = rm.load(params), rm.load(uncalibrated(params))
    out = {}
    for j, rank in enumerate(router.ranks):
        if rank not in per_tier:
            continue
        X, y = per_tier[rank]
        q = rm.predict_batch(router, X)[:, j]
        q0 = rm.predict_batch(raw, X)[:, j]
        out[str(rank)] = {"n": int(len(y)), "pass_rate": float(y.mean()),
                          "ece_before": rm.ece(q0, y, bins), "ece_after": rm.ece(q, y, bins),
                          "auc": _auc(q0, y), "reliability": rm.reliability(q, y, bins),
                          "reliability_before": rm.reliability(q0, y, bins)}
    return out


def curve_report(params: Mapping, X: np.ndarray, labels: np.ndarray, costs: np.ndarray,
                 quality_target: float) -> dict[str, Any]:
    """Held-out cost-quality curve (Pareto points), the τ for the quality target, baselines."""
    if not len(X):
        return {"n": 0, "curve": [], "chosen": None}
    router = rm.load(params)
    Q = rm.predict_batch(router, X)
    full = rm.cost_quality_curve(Q, router.ranks, labels, costs, fixed=rm.never_taus(params))
    frontier = rm.operating_point(np.full(len(X), labels.shape[1]), labels, costs)
    return {"n": int(len(X)), "known_labels": known_labels(labels), "curve": rm.pareto(full),
            "chosen": rm.choose_taus(full, quality_target), "quality_target": quality_target,
            "frontier": frontier}


def compare(candidate: Mapping[str, Any], active: Mapping[str, Any] | None,
            tolerance: float = 1e-9) -> dict[str, Any]:
    """Promote only if not worse on held-out quality at equal cost: the candidate's best
    quality at the active model's operating cost must reach the active model's quality.
    ``reject`` is set when it is worse than an active model (not when evidence is missing)."""
    chosen = candidate.get("chosen")
    if not candidate.get("n"):
        return {"promote": False, "reason": "no labelled held-out traces"}
    if active is None or not active.get("chosen"):
        if chosen is None:
            return {"promote": False, "reason": "no held-out operating point meets the quality target"}
        return {"promote": True, "reason": "no active model to compare with",
                "candidate": _brief(chosen)}
    a = active["chosen"]
    q_c = rm.quality_at_cost(candidate["curve"], a["cost"])
    ok = q_c >= a["quality"] - tolerance
    return {"promote": ok, "reject": not ok,
            "reason": "not worse at equal cost" if ok else "worse than the active model at equal cost",
            "active": _brief(a), "candidate": _brief(chosen) if chosen else None,
            "candidate_quality_at_active_cost": None if math.isinf(q_c) else q_c}


def _brief(point: Mapping[str, Any]) -> dict:
    return {k: point[k] for k in ("taus", "quality", "relative_quality", "cost", "cost_fraction",
                                  "shares") if k in point}
