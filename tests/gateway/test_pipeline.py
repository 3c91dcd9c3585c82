"""The pipeline state table and stage choices, on plain snapshot data (no servers)."""
from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone

import pytest

from app.gateway.context import RequestContext
from app.gateway.errors import GatewayError
from app.gateway.pipeline import RESPOND, START, TABLE, State, run_pipeline
from app.contract.snapshot import Snapshot
from app.gateway.stages import s01_route, s03_prefill
from app.contract.policy import DEFAULTS

SEED_FALLBACKS = {"S00_CACHE_PROBE": "S01_CASCADE_ROUTE", "S01_CASCADE_ROUTE": "S01_DEFAULT_TIER2",
                  "S02_SCHEMA_MINIFY": "S02_PASSTHROUGH", "S03_PREFILL": "S03_LOCAL_PREFILL",
                  "S04_DECODE": "S04_ESCALATE_TIER_UP", "S05_KEY_EXPAND": "S98_ALERT_SCHEMA_ERR"}


def snap(**policy) -> Snapshot:
    tiers = [{"name": f"tier-{r}", "rank": r, "model": "m", "upstream_kind": "pool", "pool_id": r,
              "endpoint_url": "", "api_key_env": "", "timeout_s": 5, "enabled": True,
              "price_input_per_m": "1", "price_cached_input_per_m": "0.5",
              "price_output_per_m": "2"} for r in (1, 2, 3)]
    pools = {str(r): {"id": r, "name": f"p{r}", "served_model_name": f"p{r}", "replicas": [
        {"id": r * 10 + i, "name": f"p{r}-{i}", "url": f"http://127.0.0.1:{9000 + r * 10 + i}",
         "state": "healthy", "weight": 1} for i in range(3)]} for r in (1, 2, 3)}
    return Snapshot({"version": 1, "tiers": tiers, "pools": pools, "keys": {}, "workflows": {},
                     "tenants": {"1": {"id": 1, "name": "t", "department": "d",
                                       "status": "active", "policy": {**DEFAULTS, **policy}}}})


def with_replica_state(s: Snapshot, state: str, pools: set[str] | None = None) -> Snapshot:
    """The same snapshot with the replicas of ``pools`` (default: all) in ``state``
    (a snapshot is immutable: the control plane publishes a new one)."""
    raw = s.data.to_json()
    for pid, pool in raw["pools"].items():
        if pools is None or pid in pools:
            for r in pool["replicas"]:
                r["state"] = state
    return Snapshot(raw)


def ctx_for(s: Snapshot, system: str = "static", workflow=None, tier=None) -> RequestContext:
    return RequestContext(request_id="r", snapshot=s, tenant=s.tenant(1), key={},
                          body={"model": "auto", "messages": [
                              {"role": "system", "content": system},
                              {"role": "user", "content": "q"}]},
                          workflow=workflow, requested_tier=tier)


def test_table_has_the_seed_fallbacks_and_closed_transitions():
    for state, fallback in SEED_FALLBACKS.items():
        assert TABLE[state].fallback == fallback
    for state, spec in TABLE.items():
        assert spec.next and all(n == RESPOND or n in TABLE for n in spec.next)
        assert spec.fallback is None or spec.fallback in TABLE
    assert START == "S00_CACHE_PROBE"


def test_a_failing_stage_degrades_to_its_fallback():
    async def boom(ctx):
        raise RuntimeError("router model missing")

    async def tier2(ctx):
        ctx.tier = {"name": "fallback"}
        return RESPOND

    table = {"A": State(boom, frozenset({RESPOND}), "B"), "B": State(tier2, frozenset({RESPOND}))}
    ctx = ctx_for(snap())
    asyncio.run(run_pipeline(ctx, start="A", table=table))
    assert ctx.trace == ["A", "B"] and ctx.fallbacks == ["B"]
    assert ctx.tier == {"name": "fallback"} and "router model missing" in ctx.stage_errors[0]


def test_gateway_errors_and_illegal_transitions_are_not_swallowed():
    async def deny(ctx):
        raise GatewayError(403, "no")

    async def wrong(ctx):
        return "ELSEWHERE"

    with pytest.raises(GatewayError):
        asyncio.run(run_pipeline(ctx_for(snap()), start="A",
                                 table={"A": State(deny, frozenset({RESPOND}), "A")}))
    with pytest.raises(Exception, match="may not go to"):
        asyncio.run(run_pipeline(ctx_for(snap()), start="A",
                                 table={"A": State(wrong, frozenset({RESPOND}))}))


def test_route_frontier_first_then_tier2():
    s = snap(frontier_first_hours=48)
    ctx = ctx_for(s)
    asyncio.run(s01_route.run(ctx))
    assert ctx.tier["name"] == "tier-3"  # a workflow nobody has seen
    old = {"first_seen_at": (datetime.now(timezone.utc) - timedelta(hours=49)).isoformat()}
    ctx = ctx_for(s, workflow=old)
    assert asyncio.run(s01_route.run(ctx)) == "S01_DEFAULT_TIER2"  # no router published
    asyncio.run(s01_route.default_tier2(ctx))
    assert ctx.tier["name"] == "tier-2" and ctx.telemetry["route_reason"] == "no_router"
    ctx = ctx_for(snap(allowed_tiers=["tier-1"]))
    asyncio.run(s01_route.default_tier2(ctx))
    assert ctx.tier["name"] == "tier-1"


def test_prefill_pick_is_stable_by_prefix_and_skips_failed():
    s = snap()
    ctx = ctx_for(s, tier=None)
    ctx.tier = s.tiers[0]
    reps = s.replicas(ctx.tier)
    first = s03_prefill.pick(ctx, reps)
    assert all(s03_prefill.pick(ctx_for(s), reps) == first for _ in range(5))
    assert s03_prefill.pick(ctx, list(reversed(reps))) == first  # order-independent
    picks = {s03_prefill.pick(ctx_for(s, system=f"prompt {i}"), reps)["id"] for i in range(30)}
    assert len(picks) == 3  # different prefixes spread over the replicas
    ctx.failed_replicas = {first["url"]}
    asyncio.run(s03_prefill.run(ctx))
    assert ctx.replica["url"] != first["url"]


def test_no_healthy_replica_takes_local_prefill_then_escalates():
    s = with_replica_state(snap(), "starting")
    ctx = ctx_for(s)
    ctx.tier = s.tiers[0]
    with pytest.raises(s03_prefill.NoReplica):
        asyncio.run(s03_prefill.run(ctx))
    assert asyncio.run(s03_prefill.local_prefill(ctx)) == "S04_DECODE"
    ctx.snapshot = with_replica_state(s, "down", pools={"1"})
    assert asyncio.run(s03_prefill.local_prefill(ctx)) == "S04_ESCALATE_TIER_UP"
