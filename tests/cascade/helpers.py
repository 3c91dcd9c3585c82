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


def accept_regret(tenant, max_regret: float = 0.05) -> None:
    """Let ``tenant``'s routers be promoted at a regret bound of ``max_regret``. 800 of these
    traces leave ~160 held-out rows: with none failing, the 95% bound on a tier's regret is
    about 3.7 / 160 = 2.3%, above the default 0.8% (that needs ~460 clean held-out labels
    per tier); tests of versioning and publishing are not about that bound."""
    from app.extensions import db
    from app.policies.models import Policy
    db.session.add(Policy(tenant_id=tenant.id, values={"router_max_regret": max_regret}))
    db.session.commit()
