"""S03_PREFILL: choose the replica of the tier's pool that serves the request.

Weighted rendezvous hashing with bounded load (``app.core.rendezvous.sluice_choice``, the
policy the simulator and the prefix-routing bench measure): the key is the
session id (header ``X-Sluice-Session`` / ``X-Session-Id`` or the OpenAI ``user``, per
the policy's ``session_key``), else a hash of the static prefix (leading system
messages + tools, cut to ``prefix_key_tokens``), salted with the tenant's cache salt
when the policy isolates its prefix cache. Live loads (in-flight counts of every
gateway + scraped ``num_requests_waiting``) come from Redis (``app.routing.load``); with
Redis out the choice is plain rendezvous. A failover before the first byte takes the
next replica in HRW order. Fallback S03_LOCAL_PREFILL takes any live replica without
affinity, or escalates when the tier has none left.

The policy's ``replica_choice: round_robin`` replaces all that with plain round-robin over
the healthy replicas (per gateway process, like a Kubernetes Service): the baseline that
``bench/prefix_routing.py`` drives through the same gateway.
"""
from __future__ import annotations

import itertools
import logging

import orjson

from app.core.rendezvous import ReplicaView, affinity_key, hrw_order, sluice_choice
from app.gateway.context import RequestContext
from app.routing.load import cache_salt_for, read_loads_async

log = logging.getLogger(__name__)
_round_robin: dict[str, itertools.count] = {}   # per tier, this process


def _text(content) -> str:
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content or ""


def static_prefix(body: dict) -> str:
    """What every request of the kind shares at the start of the prompt: the leading
    system/developer messages and the tool definitions."""
    parts = []
    for m in body.get("messages") or []:
        if m.get("role") not in ("system", "developer"):
            break
        parts.append(_text(m.get("content")))
    if body.get("tools"):
        parts.append(orjson.dumps(body["tools"], option=orjson.OPT_SORT_KEYS).decode())
    return "\n".join(parts)


def salt(ctx: RequestContext) -> str | None:
    """The tenant's engine cache salt when its policy isolates the prefix cache."""
    secret = ""
    if ctx.gw is not None:
        secret = ctx.gw.config.get("CACHE_SALT_SECRET") or ctx.gw.config.get("SECRET_KEY") or ""
    return cache_salt_for(ctx.policy, ctx.tenant["id"], secret or "sluice")


def routing_key(ctx: RequestContext) -> str:
    if ctx.routing_key is None:
        ctx.routing_key = affinity_key(
            ctx.session_id, static_prefix(ctx.body) or None,
            int(ctx.policy.get("prefix_key_tokens") or 4500), salt=salt(ctx) or "",
            fallback=ctx.request_id)
    return ctx.routing_key


def _views(replicas: list[dict]) -> tuple[list[ReplicaView], dict]:
    by_id = {}
    views = []
    for r in replicas:
        rid = r.get("id") if r.get("id") is not None else r["url"]
        by_id[rid] = r
        views.append(ReplicaView(id=rid, url=r["url"], weight=float(r.get("weight") or 1.0)))
    return views, by_id


def pick(ctx: RequestContext, replicas: list[dict]) -> dict:
    """The first of ``replicas`` in the request's HRW order (failover: the next one)."""
    views, by_id = _views(replicas)
    return by_id[hrw_order(routing_key(ctx), views)[0].id]


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


async def _loads(ctx: RequestContext, ids: list) -> dict:
    gw = ctx.gw
    if gw is None or len(ids) < 2:
        return {}
    try:
        return await read_loads_async(gw.redis, ids, gw.keys)
    except Exception as exc:  # noqa: BLE001 - Redis out: rendezvous without load
        log.debug("replica loads unavailable: %s", exc)
        return {}


async def run(ctx: RequestContext) -> str:
    reps = live_replicas(ctx, healthy_only=True)
    if not reps:
        raise NoReplica(f"no healthy replica for tier {ctx.tier['name']}")
    if len(reps) == 1:
        ctx.replica = reps[0]
        return "S04_DECODE"
    if ctx.policy.get("replica_choice") == "round_robin":
        turn = next(_round_robin.setdefault(ctx.tier["name"], itertools.count()))
        ctx.replica = sorted(reps, key=lambda r: str(r.get("id") or r["url"]))[turn % len(reps)]
        return "S04_DECODE"
    views, by_id = _views(reps)
    loads = await _loads(ctx, [v.id for v in views])
    choice = sluice_choice(routing_key(ctx), views, loads,
                           float(ctx.policy.get("bounded_load_factor") or 1.25))
    ctx.replica = by_id[choice.id]
    ctx.telemetry["replica_load"] = {str(k): v for k, v in loads.items()} if loads else None
    return "S04_DECODE"


async def local_prefill(ctx: RequestContext) -> str:
    reps = live_replicas(ctx, healthy_only=False)
    if not reps:
        ctx.last_error = ctx.last_error or NoReplica(f"tier {ctx.tier['name']} has no replica")
        return "S04_ESCALATE_TIER_UP"
    ctx.replica = reps[0]
    return "S04_DECODE"
