"""S03_PREFILL: choose the replica of the tier's pool that serves the request.

``pick(ctx, replicas)`` is the replaceable policy (prefix affinity now; rendezvous with
bounded load later). Fallback S03_LOCAL_PREFILL takes any live replica without
affinity, or escalates when the tier has none left.
"""
from __future__ import annotations

import hashlib

from app.core.workflow import static_system_prompt
from app.gateway.context import RequestContext


def prefix_key(ctx: RequestContext) -> str:
    return f"{ctx.tenant['id']}:{ctx.session_id or ''}:{static_system_prompt(ctx.body['messages'])}"


def pick(ctx: RequestContext, replicas: list[dict]) -> dict:
    """Stable choice by hash of the static prefix, over replicas sorted by id."""
    ordered = sorted(replicas, key=lambda r: (r.get("id") or 0, r["url"]))
    h = int.from_bytes(hashlib.blake2b(prefix_key(ctx).encode(), digest_size=8).digest(), "big")
    return ordered[h % len(ordered)]


def external_replica(tier: dict) -> dict:
    return {"id": None, "name": tier["name"], "url": tier["endpoint_url"], "state": "healthy"}


def live_replicas(ctx: RequestContext, *, healthy_only: bool) -> list[dict]:
    tier = ctx.tier
    if tier.get("upstream_kind") == "external":
        reps = [external_replica(tier)] if tier.get("endpoint_url") else []
    else:
        reps = ctx.snapshot.replicas(tier)
    reps = [r for r in reps if r.get("url") and r["url"] not in ctx.failed_replicas]
    if healthy_only:
        up = ctx.gw.upstream if ctx.gw is not None else None
        reps = [r for r in reps if r.get("state") == "healthy"
                and (up is None or not up.is_ejected(r["url"]))]
    else:
        reps = [r for r in reps if r.get("state") not in ("stopped", "down")]
    return reps


class NoReplica(RuntimeError):
    pass


async def run(ctx: RequestContext) -> str:
    reps = live_replicas(ctx, healthy_only=True)
    if not reps:
        raise NoReplica(f"no healthy replica for tier {ctx.tier['name']}")
    ctx.replica = pick(ctx, reps)
    return "S04_DECODE"


async def local_prefill(ctx: RequestContext) -> str:
    reps = live_replicas(ctx, healthy_only=False)
    if not reps:
        ctx.last_error = ctx.last_error or NoReplica(f"tier {ctx.tier['name']} has no replica")
        return "S04_ESCALATE_TIER_UP"
    ctx.replica = reps[0]
    return "S04_DECODE"
