"""S01_CASCADE_ROUTE: choose the tier.

An explicit tier is honoured (handlers.resolve_model already refused it with 403 when the
policy has ``allow_explicit_tier`` off). ``auto`` sends a new workflow (unknown, or
younger than the policy's ``frontier_first_hours``) to the frontier tier; otherwise the
calibrated router active for the request's scope (``ctx.services.routers``, published by the
control plane) picks the cheapest tier with q_k ≥ τ_k: the τ published with that router
version (set at its promotion to hold the scope's regret bound), else the policy's
``router_tau_1/2``. Its
input is the request's one embedding (S00's, or made here) plus structural features.

Every ``auto`` request logs that feature vector (``ctx.router_features``, a training
trace), whoever chose its tier: the frontier-first and no-router requests are what the
first router of a scope learns from. An explicit-tier request logs it only when S00
already made the embedding (free). Computing the vector for a trace never changes the
route: a failure there is recorded in the telemetry and the request goes on.

No router for the scope, or a router that cannot score the request, goes to
S01_DEFAULT_TIER2: tier 2 (the second-cheapest tier the tenant may use); with the policy's
``frontier_until_router`` on, a scope with no router goes to the frontier instead (reason
"frontier_until_router"), so no auto traffic reaches a cheaper tier before a promoted
version has shown, within ``router_max_regret``, that it may; for a request of a workflow
that version must be the workflow's own (the tenant's and the global router are not asked).
"""
from __future__ import annotations

import time
from datetime import datetime

import anyio
import numpy as np

from app.core import router_model as rm
from app.core.router_features import request_features
from app.gateway.context import RequestContext
from app.gateway.errors import GatewayError
from app.gateway.request_facts import embedding, schema_present

DEFAULT_TIER2 = "S01_DEFAULT_TIER2"


def _allowed(ctx: RequestContext) -> list[dict]:
    tiers = ctx.snapshot.allowed_tiers(ctx.tenant)
    if not tiers:
        raise GatewayError(403, "No tier is available to this tenant.", code="no_tier_allowed")
    return tiers


def tier2(tiers: list[dict]) -> dict:
    """The rank-2 tier when allowed, else the nearest allowed by rank (higher first)."""
    ranked = sorted(tiers, key=lambda t: (abs(t["rank"] - 2), -t["rank"]))
    return ranked[0]


def tier_for_rank(tiers: list[dict], rank: int) -> dict:
    """The cheapest allowed tier at or above ``rank`` (the highest allowed when none is)."""
    up = [t for t in sorted(tiers, key=lambda t: t["rank"]) if t["rank"] >= rank]
    return up[0] if up else max(tiers, key=lambda t: t["rank"])


def is_new_workflow(workflow: dict | None, frontier_first_hours: float,
                    now: float | None = None) -> bool:
    if workflow is None:
        return True
    first = datetime.fromisoformat(workflow["first_seen_at"]).timestamp()
    return ((now or time.time()) - first) < frontier_first_hours * 3600


def own_only(ctx: RequestContext) -> bool:
    """Under frontier_until_router a workflow leaves the frontier only by its own router: a
    tenant-wide one learned from the other workflows' labels (an adapter that passes one
    workflow, the base model another) says nothing of this workflow's cheaper tiers."""
    return bool(ctx.policy.get("frontier_until_router")) and bool(ctx.workflow_signature)


def active_router(ctx: RequestContext) -> rm.Router | None:
    routers = getattr(ctx.services, "routers", None)
    if routers is None:
        return None
    return routers.get(ctx.tenant["id"], ctx.workflow_signature or None, own_only=own_only(ctx))


def taus(ctx: RequestContext) -> dict[int, float]:
    """τ of the request's router: its version's own (promotion set them), else the policy's."""
    routers = getattr(ctx.services, "routers", None)
    own = routers.taus(ctx.tenant["id"], ctx.workflow_signature or None,
                       own_only=own_only(ctx)) if routers else None
    return own or rm.taus_from_policy(ctx.policy)


def features(ctx: RequestContext) -> np.ndarray:
    return request_features(ctx.embedding, ctx.body.get("messages") or [],
                            schema_present=schema_present(ctx.body),
                            workflow=ctx.workflow_signature or None)


async def trace_features(ctx: RequestContext, *, embed: bool = True) -> None:
    """Log the feature vector of a request the router did not decide (never raises)."""
    try:
        if ctx.embedding is None:
            if not embed:
                return
            await anyio.to_thread.run_sync(embedding, ctx)
        ctx.router_features = features(ctx)
    except Exception as exc:  # noqa: BLE001 - a missing trace must not change the route
        ctx.telemetry["router_features_error"] = f"{type(exc).__name__}: {exc}"[:200]


async def run(ctx: RequestContext) -> str:
    if ctx.requested_tier is not None:
        ctx.tier = ctx.requested_tier
        ctx.telemetry["route_reason"] = "explicit"
        await trace_features(ctx, embed=False)
        return "S02_SCHEMA_MINIFY"
    tiers = _allowed(ctx)
    if is_new_workflow(ctx.workflow, float(ctx.policy["frontier_first_hours"])):
        ctx.tier = tiers[-1]
        ctx.telemetry["route_reason"] = "frontier_first"
        await trace_features(ctx)
        return "S02_SCHEMA_MINIFY"
    router = active_router(ctx)
    if router is None:
        if ctx.policy.get("frontier_until_router"):
            ctx.tier = tiers[-1]
            ctx.telemetry["route_reason"] = "frontier_until_router"
            await trace_features(ctx)
            return "S02_SCHEMA_MINIFY"
        ctx.telemetry["route_reason"] = "no_router"
        await trace_features(ctx)
        return DEFAULT_TIER2
    if ctx.embedding is None:
        await anyio.to_thread.run_sync(embedding, ctx)
    x = ctx.router_features = features(ctx)
    decision = rm.route_decision(router, x, taus(ctx))
    if decision.reason == rm.S01_DEFAULT_TIER2:
        ctx.telemetry["route_reason"] = "router_error"
        ctx.telemetry["router_error"] = decision.error
        return DEFAULT_TIER2
    ctx.tier = tier_for_rank(tiers, decision.tier_rank)
    # Complexity: how likely the cheapest tier is to miss the quality bar.
    ctx.router_score = round(1.0 - decision.scores[min(decision.scores)], 6)
    ctx.telemetry["router_scores"] = {str(k): round(v, 6) for k, v in decision.scores.items()}
    ctx.telemetry["route_reason"] = "router"
    return "S02_SCHEMA_MINIFY"


async def default_tier2(ctx: RequestContext) -> str:
    ctx.tier = ctx.requested_tier or tier2(_allowed(ctx))
    if ctx.telemetry.get("route_reason") not in ("no_router", "router_error"):
        ctx.telemetry["route_reason"] = "fallback_tier2"  # S01 raised
    return "S02_SCHEMA_MINIFY"
