"""Synthetic labelled traces for the router service tests."""
from __future__ import annotations

import numpy as np

from app.cascade.evaluation import held_out


def traces(n: int, seed: int = 0, *, flip_train: bool = False, prefix: str = "r") -> list[dict]:
    """Every trace is served by the frontier (pass) with shadow labels for tiers 1 and 2.
    Difficulty is feature 0: tier 1 passes below 0, tier 2 below 1 (1% label noise on the
    training traces; held-out labels are clean so the 99% target is reachable on ~160 rows).
    ``flip_train`` inverts the tier labels of the non-held-out traces (a broken label feed)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        x = rng.normal(size=4)
        d = x[0]
        rid = f"{prefix}-{seed}-{i}"
        noise = (rng.random(2) < 0.01) & (not held_out(rid, 0.2))
        ok1, ok2 = bool((d < 0) ^ noise[0]), bool((d < 1) ^ noise[1])
        if flip_train and not held_out(rid, 0.2):
            ok1, ok2 = not ok1, not ok2
        out.append({"request_id": rid, "features": x.tolist(), "tier_rank": 3,
                    "feedback": "pass", "prompt_tokens": 1000, "completion_tokens": 100,
                    "shadow": {"1": ok1, "2": ok2}})
    return out
