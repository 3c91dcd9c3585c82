"""Replica-routing area operations: simulator runs kept as drill history, and the lint report."""
from __future__ import annotations

from typing import Any

from app.drills import service as drills
from app.drills.models import DrillRun
from app.errors import ValidationError

SIM_KIND = "prefix-routing-sim"
MAX_CONSOLE_REQUESTS = 20_000


def sim_verdict(result: dict, *, min_hit: float = 0.88, within: float = 0.05,
                max_load: float = 1.25) -> dict:
    """The issue's bar: sluice hit rate >= ``min_hit``, within ``within`` (absolute) of the
    best non-oracle policy, max/mean load <= ``max_load``."""
    from app.core.prefix_sim import best_non_oracle
    pols = result["policies"]
    if "sluice" not in pols:
        return {"passed": None}
    s = pols["sluice"]
    best, best_rate = best_non_oracle(result)
    checks = {"hit_rate": s["hit_rate"] >= min_hit,
              "near_best": best_rate - s["hit_rate"] <= within,
              "balanced": s["max_over_mean_load"] <= max_load}
    return {"passed": all(checks.values()), "checks": checks, "best_non_oracle": best,
            "best_hit_rate": best_rate}


def record_simulation(result: dict, params: dict[str, Any], actor=None) -> DrillRun:
    run = drills.start_run(SIM_KIND, {k: v for k, v in params.items()
                                      if isinstance(v, (int, float, str, type(None)))}, actor)
    verdict = sim_verdict(result)
    return drills.finish_run(run, {**result, "verdict": verdict}, passed=verdict["passed"])


def run_seed_simulation(replicas: int, kv_tokens: int, requests: int, actor=None,
                        seed: int = 28) -> DrillRun:
    """The console's "run on the seed preset" button: bounded in size, recorded."""
    errors = {}
    if not 1 <= replicas <= 64:
        errors["replicas"] = ["must be between 1 and 64"]
    if not 1024 <= kv_tokens <= 100_000_000:
        errors["kv_tokens"] = ["must be between 1,024 and 100,000,000"]
    if not 100 <= requests <= MAX_CONSOLE_REQUESTS:
        errors["requests"] = [f"must be between 100 and {MAX_CONSOLE_REQUESTS:,}"]
    if errors:
        raise ValidationError("invalid simulation", errors)
    from app.core.prefix_sim import SimParams, simulate
    from app.replica_routing.workload import seed_workload
    params = SimParams(replicas=replicas, kv_tokens=kv_tokens)
    result = simulate(seed_workload(requests, seed=seed), params)
    return record_simulation(result, {"workload": f"preset:seed:{requests}:{seed}",
                                      **params.__dict__}, actor)


def latest_simulations(limit: int = 10) -> list[DrillRun]:
    return drills.list_runs(SIM_KIND, limit)


def kv_routing_status() -> dict[str, Any]:
    """The Routing page's live view of replica choice: the policy in force (global value and
    how many tenants override it) and, per pool replica, the KV-event index freshness
    (``app.contract.kv_index.freshness``), the share of routed prompt tokens the index
    matched, and the prefix-cache hit rate from the engine's own counters (the node
    worker's last scrape)."""
    from app.catalog.models import Pool
    from app.extensions import db
    from app.policies.models import Policy
    from app.policies.service import global_values
    from app.redis_client import get_redis, keys
    from app.contract import inflight, kv_index
    in_force = global_values().get("replica_choice") or "sluice"
    overrides: dict[str, int] = {}
    for p in db.session.scalars(db.select(Policy).where(Policy.tenant_id.is_not(None))):
        choice = (p.values or {}).get("replica_choice")
        if choice and choice != in_force:
            overrides[choice] = overrides.get(choice, 0) + 1
    r, k = get_redis(), keys()
    pools = []
    for pool in db.session.scalars(db.select(Pool).order_by(Pool.name)):
        reps = [rep for rep in pool.replicas if rep.state != "stopped"]
        if not reps:
            continue
        ids = [rep.id for rep in reps]
        fresh = kv_index.freshness(r, k, ids)
        loads, pending = inflight.read_loads_pending(r, ids, k)
        pipe = r.pipeline(transaction=False)
        for rid in ids:
            pipe.hget(k.replica_stats(rid), "prefix_cache_hit_rate")
        hit = pipe.execute()
        pools.append({"name": pool.name, "events": bool((pool.options or {}).get("kv_events")),
                      "replicas": [{"id": rep.id, "name": rep.name, "state": rep.state,
                                    **fresh[rep.id],
                                    "fresh": fresh[rep.id]["age_s"] is not None
                                    and fresh[rep.id]["age_s"] <= kv_index.STALE_S,
                                    "load": loads[rep.id], "pending": pending[rep.id],
                                    "hit_rate": float(h) if h is not None else None}
                                   for rep, h in zip(reps, hit)]})
    return {"in_force": in_force, "overrides": overrides, "pools": pools,
            "stale_s": kv_index.STALE_S}
