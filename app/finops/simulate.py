"""A month of generated ledger traffic shaped like the seed's cohort table (6.3), priced
with the real cost model. For tests, screenshots and demos: rows are plain dicts."""
from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence, Tuple

from app.core import costing, pricing
from app.finops.rollups import month_range


@dataclass(frozen=True)
class Cohort:
    share: float            # of requests
    tier_mix: tuple[float, float, float]  # T1, T2, T3 among cache misses
    prefix_hit: float       # cached_tokens / prompt_tokens
    semantic_hit: float
    exact_hit: float
    ttft_ms: float          # median for tier 1
    prompt: int
    completion: int
    minify: float           # output tokens saved by key minification


COHORTS: dict[str, Cohort] = {
    "structured_extraction": Cohort(0.36, (0.89, 0.09, 0.02), 0.924, 0.24, 0.03, 14.2,
                                    2600, 250, 0.40),
    "support_rag": Cohort(0.28, (0.68, 0.26, 0.06), 0.881, 0.29, 0.02, 18.8, 3200, 300, 0.0),
    "code_sql": Cohort(0.20, (0.0, 0.74, 0.26), 0.845, 0.06, 0.01, 23.4, 2500, 450, 0.0),
    "complex_reasoning": Cohort(0.10, (0.0, 0.48, 0.52), 0.81, 0.02, 0.0, 29.1, 3600, 600, 0.0),
    "batch_summarization": Cohort(0.06, (0.96, 0.04, 0.0), 0.94, 0.0, 0.0, 16.5, 4000, 200, 0.0),
}


@dataclass(frozen=True)
class SimTier:
    name: str
    model: str
    prices: Mapping[str, Any]  # app.core.pricing tier: own prices and its price_schedule


@dataclass(frozen=True)
class SimWorkflow:
    tenant_id: int
    signature: str
    category: str


# (tier served or None for a cache hit, at, prompt, cached, completion, raw completion)
#   -> (cost, frontier baseline)
Pricer = Callable[[Optional[SimTier], datetime, int, int, int, int], Tuple[Decimal, Decimal]]


def schedule_pricer(tiers: Sequence[SimTier]) -> Pricer:
    """Books with the gateway's ``pricing.book_cost`` over the SimTiers' own prices
    (rank = position), rounded to ledger precision (a cache hit's cost stays 0)."""
    ranked = {t.name: {**t.prices, "rank": rank} for rank, t in enumerate(tiers, start=1)}
    all_tiers = list(ranked.values())

    def price(tier, at, prompt, cached, completion, raw):
        served = None if tier is None else ranked[tier.name]
        cost, baseline = pricing.book_cost(all_tiers, served, at, prompt, cached,
                                           completion, raw)
        return (cost if served is None else costing.to_ledger(cost)), \
            costing.to_ledger(baseline)
    return price


def generate_month(period: str, workflows: Sequence[SimWorkflow], tiers: Sequence[SimTier],
                   n: int, *, seed: int = 7, prefix: str = "sim",
                   price: Pricer | None = None) -> Iterator[dict]:
    """``n`` ledger rows spread over ``period``. ``tiers`` go cheapest first; the last is
    the frontier (the baseline). ``price`` books each request (default: the tiers' own
    schedules); tests pass the gateway's booking function over a config snapshot."""
    rnd = random.Random(seed)
    judge = random.Random(seed + 1)   # labels: their own stream, so the traffic is unchanged
    start, end = month_range(period)
    span = (end - start).total_seconds()
    price = price or schedule_pricer(tiers)
    by_cat: dict[str, list[SimWorkflow]] = {}
    for wf in workflows:
        by_cat.setdefault(wf.category, []).append(wf)
    cats = [c for c in COHORTS if c in by_cat]
    weights = [COHORTS[c].share for c in cats]
    for i in range(n):
        cat = rnd.choices(cats, weights)[0]
        co, wf = COHORTS[cat], rnd.choice(by_cat[cat])
        at = start + timedelta(seconds=rnd.random() * span)
        prompt = max(int(rnd.lognormvariate(0, 0.5) * co.prompt), 16)
        completion = max(int(rnd.lognormvariate(0, 0.5) * co.completion), 1)
        raw = int(completion / (1 - co.minify)) if co.minify else completion
        r = rnd.random()
        cache = "semantic" if r < co.semantic_hit else \
            "exact" if r < co.semantic_hit + co.exact_hit else "miss"
        rank = rnd.choices(range(len(tiers)), co.tier_mix[:len(tiers)])[0]
        escalated = cache == "miss" and rank < len(tiers) - 1 and rnd.random() < 0.04
        rank += 1 if escalated else 0
        tier = tiers[rank]
        if cache == "miss":
            cached = min(int(prompt * min(max(rnd.gauss(co.prefix_hit, 0.05), 0), 1)), prompt)
            ttft = round(rnd.lognormvariate(0, 0.25) * co.ttft_ms * (1 + 0.6 * rank), 2)
        else:
            cached, ttft = 0, round(rnd.uniform(2.0, 6.0), 2)
        cost, baseline = price(tier if cache == "miss" else None, at, prompt, cached,
                               completion, raw)
        saved = _stage_savings(tier if cache == "miss" else None, at, prompt, cached,
                               completion, raw, cost, baseline)
        yield {
            "request_id": f"{prefix}-{seed}-{i}", "kind": "request", "at": at,
            "tenant_id": wf.tenant_id, "workflow": wf.signature,
            "tier": tier.name if cache == "miss" else "",
            "model": tier.model if cache == "miss" else "", "status": 200, "cache": cache,
            "prompt_tokens": prompt, "cached_tokens": cached, "completion_tokens": completion,
            "cost_usd": cost, "baseline_cost_usd": baseline, "escalated": escalated,
            "ttft_ms": ttft, "latency_ms": round(ttft + completion * 0.9, 2),
            **{f"saved_{k}_usd": v for k, v in saved.items()},
            "payload": {"request_id": f"{prefix}-{seed}-{i}",
                        **_labels(judge, cache, rank, escalated),
                        "caching_and_routing_decision": {
                            "semantic_cache_hit": cache == "semantic",
                            "radix_prefix_cache_tokens_reused": cached,
                            "assigned_compute_tier": tier.name,
                            "cascade_fallback_triggered": escalated},
                        "token_and_latency_telemetry": {
                            "time_to_first_token_ms": ttft,
                            "raw_schema_output_tokens_equivalent": raw,
                            "minified_schema_tokens_generated": completion,
                            "request_cost_usd": f"{cost:f}",
                            "baseline_frontier_equivalent_cost_usd": f"{baseline:f}"}},
        }


# Share of served answers a client judges (POST /v1/feedback), and how often a tier's
# answer passes (cheaper tiers a little less often): quality parity for the cohort report.
FEEDBACK_SHARE = 0.2
PASS_RATE = {1: 0.955, 2: 0.962, 3: 0.968}


def _labels(judge: random.Random, cache: str, rank: int, escalated: bool) -> dict[str, Any]:
    """The router-trace fields of a served request: the tier's rank, the escalation and,
    for a sample, the client's verdict."""
    if cache != "miss":
        return {}
    served = rank + 1                  # tiers go cheapest first, ranked by position
    out: dict[str, Any] = {"tier_rank": served, "escalated_from": [served - 1] if escalated
                           else None}
    if judge.random() < FEEDBACK_SHARE:
        out["feedback"] = {"pass": judge.random() < PASS_RATE.get(served, 0.96), "note": "",
                           "at": None}
    return out


def _stage_savings(tier: SimTier | None, at: datetime, prompt: int, cached: int,
                   completion: int, raw: int, cost: Decimal, baseline: Decimal
                   ) -> dict[str, Decimal]:
    """The row's per-stage savings (``pricing.stage_savings`` at the SimTier's prices),
    with routing taking what makes them add up to the booked ``baseline - cost`` (a test's
    pricer may book from the catalog, to the same prices)."""
    parts = pricing.stage_savings([], tier.prices if tier else None, at, prompt, cached,
                                  completion, raw, cache_hit=tier is None)
    if tier is None:
        return {**parts, "routing": Decimal(0), "cache": costing.to_ledger(baseline)}
    rest = sum((v for k, v in parts.items() if k != "routing"), Decimal(0))
    return {**parts, "routing": costing.to_ledger(baseline) - costing.to_ledger(cost) - rest}


def default_tiers(price_change_at: datetime | None = None) -> list[SimTier]:
    """Three tiers priced like the seed's (distilled 8B, 70B, frontier); the frontier's
    price drops at ``price_change_at`` when given."""
    def sched(i, c, o, change=None):
        own = {"price_input_per_m": i, "price_cached_input_per_m": c, "price_output_per_m": o}
        return pricing.tier_with_schedule(own, [change] if change else [])
    change = None if price_change_at is None else {
        "effective_from": price_change_at, "price_input_per_m": Decimal("4.00"),
        "price_cached_input_per_m": Decimal("2.00"), "price_output_per_m": Decimal("12.00")}
    return [SimTier("tier-1", "qwen2.5-7b-fp8", sched("1.00", "0.50", "3.00")),
            SimTier("tier-2", "llama-3.3-70b", sched("3.00", "1.50", "9.00")),
            SimTier("tier-3", "frontier", sched("5.00", "2.50", "15.00", change))]


def mid_month(period: str) -> datetime:
    start, _ = month_range(period)
    return start.replace(day=15, hour=12, tzinfo=timezone.utc)


def add_catalog(tiers: Sequence[SimTier]) -> None:
    """Tier rows (rank = position) and their TierPrice changes for ``tiers``, in the
    session (the caller commits): the catalog the gateway's snapshot prices from."""
    from app.catalog.models import Tier
    from app.extensions import db
    from app.finops.models import TierPrice
    keys = ("price_input_per_m", "price_cached_input_per_m", "price_output_per_m")
    for rank, t in enumerate(tiers, start=1):
        row = Tier(name=t.name, rank=rank, model=t.model, upstream_kind="external",
                   **{k: t.prices[k] for k in keys})
        db.session.add(row)
        db.session.flush()
        for p in t.prices["price_schedule"]:
            db.session.add(TierPrice(tier_id=row.id, effective_from=p["effective_from"],
                                     **{k: p[k] for k in keys}))
