"""S01_CASCADE_ROUTE: choose the tier. Simplest rule until the calibrated router lands:
an explicit tier is honoured; ``auto`` sends a new workflow (unknown, or younger than the
policy's ``frontier_first_hours``) to the frontier tier, anything else to tier 2.
Fallback S01_DEFAULT_TIER2: tier 2 (the second-cheapest tier the tenant may use)."""
from __future__ import annotations

import time
from datetime import datetime

from app.gateway.context import RequestContext
from app.gateway.errors import GatewayError


def _allowed(ctx: RequestContext) -> list[dict]:
    tiers = ctx.snapshot.allowed_tiers(ctx.tenant)
    if not tiers:
        raise GatewayError(403, "No tier is available to this tenant.", code="no_tier_allowed")
    return tiers


def tier2(tiers: list[dict]) -> dict:
    """The rank-2 tier when allowed, else the nearest allowed by rank (higher first)."""
    ranked = sorted(tiers, key=lambda t: (abs(t["rank"] - 2), -t["rank"]))
    return ranked[0]


def is_new_workflow(workflow: dict | None, frontier_first_hours: float,
                    now: float | None = None) -> bool:
    if workflow is None:
        return True
    first = datetime.fromisoformat(workflow["first_seen_at"]).timestamp()
    return ((now or time.time()) - first) < frontier_first_hours * 3600


async def run(ctx: RequestContext) -> str:
    if ctx.requested_tier is not None:
        ctx.tier = ctx.requested_tier
        return "S02_SCHEMA_MINIFY"
    tiers = _allowed(ctx)
    if is_new_workflow(ctx.workflow, float(ctx.policy.get("frontier_first_hours") or 0)):
        ctx.tier = tiers[-1]
        ctx.telemetry["route_reason"] = "frontier_first"
    else:
        ctx.tier = tier2(tiers)
        ctx.telemetry["route_reason"] = "default_tier2"
    return "S02_SCHEMA_MINIFY"


async def default_tier2(ctx: RequestContext) -> str:
    ctx.tier = ctx.requested_tier or tier2(_allowed(ctx))
    ctx.telemetry["route_reason"] = "fallback_tier2"
    return "S02_SCHEMA_MINIFY"
