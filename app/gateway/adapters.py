"""Which LoRA adapter serves a request (S03 filters replicas by it, S04 names it).

A workflow's snapshot entry (``Snapshot.adapter``) applies to requests on tier 1 (the
cheapest tier) when that tier runs on the entry's pool:

- promoted: the adapter;
- canary at p%: the adapter for routing keys (``replicas.routing_key``: the session,
  else the static prefix) whose bucket ``sha256(key, adapter) mod 100`` is below p, the
  promoted adapter it would replace (``previous_name``) or the base model for the rest.
  The same key always lands in the same arm, and raising p only moves keys from the
  previous arm to the new adapter, so a session's prefix cache stays warm.

An arm is served only on replicas whose engine loaded its adapter: S03 picks among
those (rendezvous and bounded load as usual), and when there are none the request gets
the base model on any replica. A replica where the load failed never sees the adapter.
"""
from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from app.contract.snapshot import AdapterEntry, ShadowEntry, Snapshot
from app.gateway.context import RequestContext
from app.gateway.replicas import routing_key

PROMOTED, CANARY = "promoted", "canary"


def bucket(key: str, adapter: str) -> int:
    """The routing key's canary bucket, 0..99: stable across processes and releases."""
    digest = hashlib.sha256(f"{key}\x1f{adapter}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % 100


def arm(entry: AdapterEntry | None, key: str) -> tuple[str, tuple[int, ...]] | None:
    """(adapter, replica ids where it is loaded) that serves ``key`` under ``entry``, or
    None for the base model. Pure."""
    if entry is None or not entry.name:
        return None
    if entry.state == PROMOTED or (entry.state == CANARY and
                                   bucket(key, entry.name) < entry.canary_pct):
        return entry.name, entry.replicas_loaded
    if entry.state == CANARY and entry.previous_name:
        return entry.previous_name, entry.previous_replicas_loaded
    return None


def entry_for(ctx: RequestContext) -> AdapterEntry | None:
    if not ctx.workflow_signature:
        return None
    return ctx.snapshot.adapter(ctx.tenant["id"], ctx.workflow_signature)


def tier_one(snapshot: Snapshot, pool_id: Any) -> Mapping[str, Any] | None:
    """Tier 1 (the cheapest enabled tier) when it runs on pool ``pool_id``."""
    tiers = snapshot.tiers
    if not tiers or pool_id is None:
        return None
    first = tiers[0]
    if first.get("upstream_kind") != "pool" or first.get("pool_id") != pool_id:
        return None
    return first


def _on_tier_one(ctx: RequestContext, pool_id: Any) -> bool:
    tier = ctx.tier or {}
    first = tier_one(ctx.snapshot, pool_id)
    return first is not None and tier.get("name") == first["name"]


def choice(ctx: RequestContext) -> tuple[str, tuple[int, ...]] | None:
    """The arm of ``ctx`` on its current tier: (adapter, where loaded), or None."""
    entry = entry_for(ctx)
    if entry is None or not entry.name or not _on_tier_one(ctx, entry.pool_id):
        return None
    return arm(entry, routing_key(ctx))


def replicas_for(ctx: RequestContext, reps: list[dict]) -> list[dict]:
    """``reps`` narrowed to the replicas that hold the request's adapter; all of them
    (the base model) when it has none or none of them holds it."""
    chosen = choice(ctx)
    if chosen is None:
        return reps
    loaded = set(chosen[1])
    holding = [r for r in reps if r.get("id") in loaded]
    return holding or reps


def adapter_for(ctx: RequestContext) -> str | None:
    """The adapter the attempt on ``ctx.replica`` asks for: the request's arm when that
    replica loaded it, else None (the base model)."""
    chosen = choice(ctx)
    if chosen is None:
        return None
    name, loaded = chosen
    replica_id = (ctx.replica or {}).get("id")
    return name if replica_id is not None and replica_id in loaded else None


def form_of(ctx: RequestContext, name: str | None) -> Mapping[str, Any] | None:
    """The served form adapter ``name`` of the request's workflow learned (``AdapterEntry.
    forms``), or None (no adapter, or one from before forms were kept)."""
    entry = entry_for(ctx) if name else None
    return (entry.forms or {}).get(name) if entry is not None else None


def shadow_for(ctx: RequestContext) -> ShadowEntry | None:
    """The workflow's adapter in shadow, when it is loaded somewhere."""
    entry = entry_for(ctx)
    shadow = entry.shadow if entry is not None else None
    return shadow if shadow is not None and shadow.replicas_loaded else None
