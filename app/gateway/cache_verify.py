"""Cache verification (issue 22): a sampled verifier hit, generated again off the path.

S00 serves a verifier hit (a reworded question judged the same as a cached answer) from the
cache as usual; the share policy ``cache_verify_sample_pct`` draws is noted
``cache_hit.sampled`` (with the tier that generated the cached answer). After the client has
its answer (``Gateway.book``), ``offer`` sends the same request upstream through
``app.gateway.shadow``'s off-path machinery: not streamed, no cache, nothing reserved or
settled, at most ``GATEWAY_CACHE_VERIFY_MAX_INFLIGHT`` at once per process (more are
skipped and the hit stays unchecked; 0 turns it off). It asks the tier that generated the
cached answer when the tenant may still use it, else the requested tier, else S01's
default (tier 2).

The fresh answer is compared with the served one (``answers_agree``: equal for a
temperature-0 request, similar otherwise) and ``GatewayCache.learn`` records the evidence
for the tenant's line, then marks the entry verified with its threshold down to this cosine,
or evicts it. The call is booked as a ledger event of kind ``cache_verify`` (request id
``<rid>-verify``, its real tokens priced at that tier, payload {verify_of, entry,
similarity, how, agreed, metric, entry_outcome}); FinOps shows its cost as cache
verification and leaves it out of every budget and total, as it does ``shadow`` rows.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import anyio

from app.core.cache_bound import answers_agree
from app.core.costing import to_micro
from app.gateway import shadow
from app.gateway.context import RequestContext
from app.gateway.stages.s00_cache import exact_answer
from app.gateway.stages.s01_route import tier2

log = logging.getLogger(__name__)
KIND = "cache_verify"


def sampled_hit(ctx: RequestContext) -> dict | None:
    """The hit's note when ``ctx`` was served from the cache and drawn for verification."""
    hit = ctx.telemetry.get("cache_hit")
    if (not hit or not hit.get("sampled") or ctx.status != 200
            or ctx.cached_response is None):
        return None
    return hit


def verify_tier(ctx: RequestContext, hit: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The tier to ask again: the one that generated the cached answer when the tenant may
    still use it, else the requested tier, else tier 2 (S01's default)."""
    allowed = ctx.snapshot.allowed_tiers(ctx.tenant)
    if not allowed:
        return None
    for t in allowed:
        if hit.get("tier") and t["name"] == hit["tier"]:
            return t
    if ctx.requested_tier is not None and ctx.requested_tier in allowed:
        return ctx.requested_tier
    return tier2(allowed)


def offer(ctx: RequestContext, spawn: Callable[[Any], None],
          submit: Callable[[dict], None]) -> None:
    """``Gateway.book``'s hook: when ``ctx`` is a sampled hit (and the process has room),
    ``spawn`` its verification run. Never raises."""
    try:
        hit = sampled_hit(ctx)
        if hit is None:
            return
        tier = verify_tier(ctx, hit)
        if tier is None:
            return
        probe = shadow.probe_on(ctx, shadow.VERIFY, tier)
        shadow.start(ctx, probe, lambda: run(ctx, probe, hit, submit), spawn)
    except Exception:  # noqa: BLE001 - verification never fails the answer
        log.exception("request %s: cache verification offer failed", ctx.request_id)


async def run(ctx: RequestContext, probe: shadow.Probe, hit: Mapping[str, Any],
              submit: Callable[[dict], None]) -> bool | None:
    """One verification: the upstream call, the verdict applied to the entry, the ledger
    event. Returns whether the answers agreed (None: the run failed)."""
    try:
        got = await shadow.generate(ctx, probe)
        if got is None:
            return None
        replica, model, data, latency_ms = got
        exact = exact_answer(ctx.body)
        agreed = answers_agree(ctx.cached_response, data, exact=exact)
        payload: dict[str, Any] = {
            "verify_of": ctx.request_id, "entry": hit["of_request"],
            "similarity": hit.get("similarity"), "how": hit.get("how"), "agreed": agreed,
            "metric": "exact" if exact else "similar", "replica": replica.get("name"),
            "adapter": probe.adapter if model == probe.adapter else None}
        event = shadow.off_path_event(ctx, probe, model, data.get("usage") or {},
                                      latency_ms, KIND, "", payload)
        payload["entry_outcome"] = await _learn(ctx, hit, agreed, to_micro(event["cost_usd"]))
        submit(event)
        shadow.count(ctx, probe, "agreed" if agreed else "disagreed")
        return agreed
    except Exception as exc:  # noqa: BLE001 - an off-path run never touches the answer
        log.warning("request %s: cache verification on %s failed: %s", ctx.request_id,
                    probe.tier.get("name"), exc)
        try:
            shadow.count(ctx, probe, "failed")
        except Exception:  # noqa: BLE001
            pass
        return None


async def _learn(ctx: RequestContext, hit: Mapping[str, Any], agreed: bool,
                 cost_micros: int) -> str:
    """``GatewayCache.learn`` in a worker thread (sync Redis); "error" when it failed (the
    run is booked all the same: its tokens were spent)."""
    try:
        return await anyio.to_thread.run_sync(
            ctx.services.cache.learn, ctx.tenant["id"], ctx.workflow_signature or None,
            str(hit["of_request"]), float(hit["similarity"]), agreed, "sample", cost_micros)
    except Exception:  # noqa: BLE001
        log.exception("request %s: cache verification verdict not applied", ctx.request_id)
        return "error"
