"""Replica facts S03 (the choice) and S04 (failover before the first byte) share: the
tier's live replicas, the request's rendezvous key and its HRW order, the tenant's
engine cache salt."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from app.contract.inflight import cache_salt_for
from app.core.rendezvous import ReplicaView, affinity_key, hrw_order
from app.gateway.context import RequestContext


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
    if ctx.services is not None:
        config = ctx.services.config
        secret = config["CACHE_SALT_SECRET"] or config["SECRET_KEY"]
    return cache_salt_for(ctx.policy, ctx.tenant["id"], secret or "sluice")


def routing_key(ctx: RequestContext) -> str:
    if ctx.routing_key is None:
        ctx.routing_key = affinity_key(
            ctx.session_id, static_prefix(ctx.upstream_body or ctx.body) or None,
            int(ctx.policy["prefix_key_tokens"]), salt=salt(ctx) or "",
            fallback=ctx.request_id)
    return ctx.routing_key


def views_of(replicas: list[Mapping[str, Any]]) -> tuple[list[ReplicaView], dict]:
    by_id = {}
    views = []
    for r in replicas:
        rid = r.get("id") if r.get("id") is not None else r["url"]
        by_id[rid] = r
        views.append(ReplicaView(id=rid, url=r["url"], weight=float(r.get("weight") or 1.0)))
    return views, by_id


def pick(ctx: RequestContext, replicas: list[Mapping[str, Any]]) -> Mapping[str, Any]:
    """The first of ``replicas`` in the request's HRW order (failover: the next one)."""
    views, by_id = views_of(replicas)
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
        up = ctx.services.upstream if ctx.services is not None else None
        reps = [r for r in reps if r.get("state") == "healthy"
                and (up is None or not up.is_ejected(r["url"]))]
    else:
        reps = [r for r in reps if r.get("state") not in ("stopped", "down")]
    return reps
