"""Fitting the per-tier classifiers with scikit-learn and exporting them as plain JSON params.

Per tier: standardise, logistic regression (class-balanced, so rare failures still shape
the boundary; the L2 strength picked from C_GRID by out-of-fold log-loss after isotonic
calibration), out-of-fold decision scores from stratified k-fold, a calibration map
(isotonic by default, Platt optional) fitted on those out-of-fold scores, and a final
model on all rows. Standardisation is folded into the exported coefficients, so request
time is one dot product and one interpolation per tier (app.core.router_model).
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np
from sklearn.isotonic import IsotonicRegression
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import StratifiedKFold

from app.core.router_model import PARAMS_FORMAT


C_GRID = (0.01, 0.1, 1.0)


def _lr(C: float, balanced: bool = True) -> LogisticRegression:
    return LogisticRegression(C=C, class_weight="balanced" if balanced else None, max_iter=1000)


def _constant_tier(rank: int, dim: int, rate: float) -> dict:
    rate = min(max(rate, 1e-4), 1 - 1e-4)
    return {"rank": rank, "coef": [0.0] * dim, "intercept": math.log(rate / (1 - rate)),
            "calibration": {"kind": "none"}, "n": 0}


def fit_tier(X: np.ndarray, y: np.ndarray, *, rank: int, calibration: str = "isotonic",
             folds: int = 5, Cs: Sequence[float] = C_GRID, seed: int = 0,
             raw_dims: int = 0, balanced: bool = True) -> dict:
    """One tier's exported params (coef, intercept, calibration map over the raw score).

    The first ``raw_dims`` columns are centred but not scaled: a unit-length embedding's
    384 small coordinates then cost more L2 weight than the few structural features, so
    the embedding cannot drown them with noise. ``balanced=False`` fits a plain (unweighted)
    logistic regression: with ``calibration="none"`` that is the honest "before
    calibration" reference (class weights alone shift its probabilities)."""
    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(y, dtype=int)
    n_min = int(min(y.sum(), len(y) - y.sum()))
    if n_min < 2:
        return {**_constant_tier(rank, X.shape[1], float(y.mean()) if len(y) else 0.5),
                "n": int(len(y))}
    mean = X.mean(axis=0)
    scale = X.std(axis=0)
    scale[scale < 1e-6] = 1.0
    scale[:raw_dims] = 1.0
    Xs = (X - mean) / scale
    skf = StratifiedKFold(n_splits=max(2, min(folds, n_min)), shuffle=True, random_state=seed)
    splits = list(skf.split(Xs, y))
    best = None
    for c in Cs:  # pick the regularisation by out-of-fold log-loss of the calibrated score
        oof = np.zeros(len(y))
        for fit_idx, cal_idx in splits:
            oof[cal_idx] = _lr(c, balanced).fit(Xs[fit_idx], y[fit_idx]).decision_function(
                Xs[cal_idx])
        p = np.clip(IsotonicRegression(out_of_bounds="clip").fit(oof, y).predict(oof), 1e-4, 1 - 1e-4)
        loss = float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))
        if best is None or loss < best[0]:
            best = (loss, c, oof)
    _, C, oof = best
    final = _lr(C, balanced).fit(Xs, y)
    w = final.coef_[0] / scale
    b = float(final.intercept_[0] - np.dot(final.coef_[0], mean / scale))
    if calibration == "isotonic":
        iso = IsotonicRegression(out_of_bounds="clip", y_min=0.0, y_max=1.0).fit(oof, y)
        cal = {"kind": "isotonic", "x": [float(v) for v in iso.X_thresholds_],
               "y": [float(v) for v in iso.y_thresholds_]}
    elif calibration == "platt":
        platt = LogisticRegression(C=1e6, max_iter=1000).fit(oof.reshape(-1, 1), y)
        cal = {"kind": "platt", "a": float(platt.coef_[0, 0]), "b": float(platt.intercept_[0])}
    elif calibration == "none":
        cal = {"kind": "none"}
    else:
        raise ValueError(f"unknown calibration {calibration!r}")
    return {"rank": rank, "coef": [float(v) for v in w], "intercept": b, "calibration": cal,
            "n": int(len(y)), "positives": int(y.sum()), "C": C}


def fit_router(per_tier: Mapping[int, tuple[np.ndarray, np.ndarray]], *, fallback_rank: int = 3,
               calibration: str = "isotonic", seed: int = 0, raw_dims: int = 0,
               balanced: bool = True, never: Sequence[int] = ()) -> dict:
    """Params for every cheaper tier: ``per_tier`` maps rank -> (X, y) of its labelled rows.
    A rank in ``never`` (too few labels to learn from) gets a constant score of ~0: the
    version never sends a request there (``"unlabelled": True`` says why)."""
    tiers = [fit_tier(X, y, rank=rank, calibration=calibration, seed=seed, raw_dims=raw_dims,
                      balanced=balanced)
             for rank, (X, y) in sorted(per_tier.items())]
    if never:
        dim = len(tiers[0]["coef"]) if tiers else 0
        tiers = sorted(tiers + [{**_constant_tier(rank, dim, 0.0), "unlabelled": True}
                                for rank in never if rank not in per_tier],
                       key=lambda t: t["rank"])
    dims = {len(t["coef"]) for t in tiers}
    if len(dims) != 1:
        raise ValueError("every tier needs the same feature dimension")
    return {"format": PARAMS_FORMAT, "feature_dim": dims.pop(), "fallback_rank": fallback_rank,
            "tiers": tiers}


def uncalibrated(params: Mapping) -> dict:
    """The same params with calibration removed (the 'before calibration' reference)."""
    return {**params, "tiers": [{**t, "calibration": {"kind": "none"}} for t in params["tiers"]]}
