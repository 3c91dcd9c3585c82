"""Held-out evaluation on partially labelled product traces: each tier is judged on its own
known labels, not on the (biased) few traces with every tier labelled."""
import math

import numpy as np
import pytest

from app.core import router_model as rm
from app.cascade import evaluation as ev

PRICES = {1: (0.06, 0.06), 2: (0.35, 0.35), 3: (3.5, 3.5)}


def trace(i: int, served: int, passed: bool) -> dict:
    return {"request_id": f"t{i}", "features": [float(served), float(passed)], "tier_rank": served,
            "feedback": {"pass": passed}, "prompt_tokens": 100, "completion_tokens": 10}


def product_traces() -> list[dict]:
    """10 tier-1 passes ([1,1,1]), 30 frontier passes ([?,?,1]), 10 frontier fails ([0,0,0])."""
    return ([trace(i, 1, True) for i in range(10)] + [trace(10 + i, 3, True) for i in range(30)]
            + [trace(40 + i, 3, False) for i in range(10)])


def test_every_labelled_trace_is_kept_with_unknowns_as_nan():
    X, L, C = ev.evaluation_arrays(product_traces() + [{**trace(99, 1, True), "feedback": None}],
                                   PRICES)
    assert X.shape == (50, 2) and C.shape == (50, 3)  # the unlabelled trace is left out
    assert ev.known_labels(L) == {"1": 20, "2": 20, "3": 50}
    assert np.isnan(L[10:40, :2]).all() and (L[10:40, 2] == 1).all()


def test_each_tier_is_judged_on_its_own_known_labels():
    X, L, C = ev.evaluation_arrays(product_traces(), PRICES)
    n = len(X)
    frontier = rm.operating_point(np.full(n, 3), L, C)
    # 40 of the 50 frontier answers passed; the fully labelled subset alone says 10 of 20
    assert frontier["quality"] == pytest.approx(0.8)
    assert frontier["relative_quality"] == pytest.approx(1.0)
    cheapest = rm.operating_point(np.full(n, 1), L, C)
    assert cheapest["quality"] == pytest.approx(0.5)  # 10 known passes, 10 known fails
    assert cheapest["relative_quality"] == pytest.approx(0.5 / 0.8)
    assert cheapest["evaluated"] == {1: 20, 2: 0, 3: 0}
    # a routing that sends the tier-1 passes to tier 1 and the rest to the frontier:
    # 20% share x 1.0 on tier 1 + 80% share x (30 of 40 known frontier passes)
    chosen = np.where(np.arange(n) < 10, 1, 3)
    pt = rm.operating_point(chosen, L, C)
    assert pt["quality"] == pytest.approx(0.2 * 1.0 + 0.8 * 0.75)
    assert pt["shares"] == {1: 0.2, 2: 0.0, 3: 0.8}
    # routed rows without a known label for their tier borrow the tier's known pass rate
    chosen = np.where(np.arange(n) < 40, 2, 3)  # tier 2 known only on rows 0-9 (passes)
    pt = rm.operating_point(chosen, L, C)
    assert pt["quality"] == pytest.approx(0.8 * 1.0 + 0.2 * 0.0)


def test_fully_labelled_traces_give_the_plain_mean():
    rng = np.random.default_rng(0)
    L = rng.integers(0, 2, size=(200, 3)).astype(float)
    C = rng.random((200, 3))
    chosen = rng.integers(1, 4, size=200)
    pt = rm.operating_point(chosen, L, C)
    assert pt["quality"] == pytest.approx(L[np.arange(200), chosen - 1].mean())
    assert pt["relative_quality"] == pytest.approx(pt["quality"] / L[:, 2].mean())


def test_curve_report_on_partial_labels_can_choose_taus():
    X, L, C = ev.evaluation_arrays(product_traces(), PRICES)
    # a router that is sure of tier 1 exactly on the rows served (and passed) there
    params = {"format": rm.PARAMS_FORMAT, "feature_dim": 2, "fallback_rank": 3, "tiers": [
        {"rank": 1, "coef": [-20.0, 0.0], "intercept": 30.0, "calibration": {"kind": "none"}},
        {"rank": 2, "coef": [0.0, 0.0], "intercept": -10.0, "calibration": {"kind": "none"}}]}
    rep = ev.curve_report(params, X, L, C, 0.99)
    assert rep["n"] == 50 and rep["known_labels"] == {"1": 20, "2": 20, "3": 50}
    chosen = rep["chosen"]
    assert chosen is not None and chosen["shares"][1] == pytest.approx(0.2)
    assert chosen["relative_quality"] >= 0.99 and chosen["cost_fraction"] < 0.85
    assert not math.isnan(rep["frontier"]["quality"])
