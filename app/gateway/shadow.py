"""Shadow runs: a workflow's adapter in shadow answers the same request off the path.

After the client has its answer (``Gateway.book``), a request of a workflow whose
adapter is in shadow (the snapshot entry's ``shadow``) that a higher tier than tier 1
answered successfully is, with probability ``sample_pct``, sent again to a tier-1
replica that loaded the adapter: the client's own body, ``model=<adapter>``, not
streamed, no S00 cache, the tenant's engine cache salt. The adapter's answer is compared
with the answer the client got (``verdict``) and booked as a ledger event of its own:
kind ``shadow``, request id ``<request id>-shadow``, priced at tier 1,
payload {shadow_of, adapter, agreed}. ``adapters.shadow_rollup`` turns those rows into
the adapter's concordance and its approval gate.

Shadow traffic never touches the client's answer, headers or budget: it runs as a
background task, reserves and settles nothing (``BudgetGuard`` is not called), at most
``ADAPTERS_SHADOW_MAX_INFLIGHT`` at once per process (more are skipped), and a failure
is logged and counted, never raised. FinOps leaves kind ``shadow`` out of every budget
and total.
"""
from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from typing import Any

import orjson

from app.contract.events import LedgerEvent
from app.contract.snapshot import ShadowEntry
from app.core.concordance import json_field_match, normalize_text
from app.core.pricing import tier_cost
from app.gateway import adapters, replicas
from app.gateway.context import RequestContext
from app.gateway.telemetry import usage_tokens
from app.gateway.upstream import chat_url, upstream_request_headers

log = logging.getLogger(__name__)
_open = 0   # shadow calls this process has in flight
_NOT_FORWARDED = ("stream", "stream_options", "n")


def answer_text(ctx: RequestContext) -> str | None:
    """The answer the client got (the expanded completion, or the stream the relay
    assembled), as text."""
    response = ctx.response_json if ctx.response_json is not None else ctx.collected
    try:
        content = response["choices"][0]["message"]["content"]
    except (TypeError, KeyError, IndexError):
        return None
    return content if isinstance(content, str) else None


def wants_json(body: Mapping[str, Any]) -> bool:
    rf = body.get("response_format")
    return isinstance(rf, Mapping) and rf.get("type") in ("json_object", "json_schema")


def verdict(served: str, shadow: str, as_json: bool) -> bool:
    """Whether the shadow answer agrees with the served one: JSON, every field equal
    (and no extra field); text, equal once normalized (case, punctuation, articles,
    whitespace). Pure."""
    if as_json:
        return json_field_match(served, shadow)[1]
    return normalize_text(served) == normalize_text(shadow)


def eligible(ctx: RequestContext) -> tuple[ShadowEntry, Mapping[str, Any]] | None:
    """(shadow entry, tier 1) when ``ctx`` is a request to shadow (before sampling)."""
    if ctx.status != 200 or ctx.cache != "miss" or not ctx.tier or ctx.error:
        return None
    shadow = adapters.shadow_for(ctx)
    if shadow is None:
        return None
    tier = adapters.tier_one(ctx.snapshot, shadow.pool_id)
    if tier is None or ctx.tier.get("rank", 0) <= tier["rank"]:
        return None
    return shadow, tier


def shadow_body(ctx: RequestContext, shadow: ShadowEntry) -> dict[str, Any]:
    """The client's request for the adapter: same messages and limits, not streamed."""
    body = {k: v for k, v in ctx.body.items() if k not in _NOT_FORWARDED}
    body["model"] = shadow.name
    body["stream"] = False
    salt = replicas.salt(ctx)
    if salt:
        body["cache_salt"] = salt
    return body


def _replica(ctx: RequestContext, shadow: ShadowEntry) -> Mapping[str, Any] | None:
    pool = ctx.snapshot.pools.get(str(shadow.pool_id))
    loaded = set(shadow.replicas_loaded)
    upstream = ctx.services.upstream
    reps = [r for r in (pool.replicas if pool else ()) if r.id in loaded
            and r.state == "healthy" and r.url and not upstream.is_ejected(r.url)]
    return replicas.pick(ctx, reps) if reps else None


def shadow_event(ctx: RequestContext, shadow: ShadowEntry, tier: Mapping[str, Any],
                 replica: Mapping[str, Any], usage: dict, agreed: bool,
                 latency_ms: float, as_json: bool) -> LedgerEvent:
    at = datetime.now(timezone.utc)
    prompt, cached, out = usage_tokens(usage)
    cost = tier_cost(tier, at, prompt, cached, out)
    return {
        "request_id": f"{ctx.request_id}-shadow", "at": at.isoformat(),
        "tenant_id": ctx.tenant["id"], "workflow": ctx.workflow_signature,
        "workflow_name": ctx.workflow_name, "tier": tier["name"], "model": shadow.name,
        "status": 200, "cache": "miss", "prompt_tokens": prompt, "cached_tokens": cached,
        "completion_tokens": out, "cost_usd": f"{cost:f}", "baseline_cost_usd": "0",
        "escalated": False, "ttft_ms": None, "latency_ms": round(latency_ms, 3),
        "usage_source": "upstream", "adapter": shadow.name, "kind": "shadow",
        "payload": {"shadow_of": ctx.request_id, "adapter": shadow.name, "agreed": agreed,
                    "metric": "json_fields" if as_json else "text",
                    "served_tier": ctx.tier.get("name"), "replica": replica.get("name")}}


async def run(ctx: RequestContext, shadow: ShadowEntry, tier: Mapping[str, Any],
              served: str, submit: Callable[[dict], None]) -> bool | None:
    """One shadow call and its ledger event; returns the verdict (None: it failed)."""
    global _open
    services = ctx.services
    try:
        await asyncio.sleep(0)  # the client's answer goes out first
        replica = _replica(ctx, shadow)
        if replica is None:
            services.metrics.shadow_runs.labels("no_replica").inc()
            return None
        rid = f"{ctx.request_id}-shadow"
        started = time.perf_counter()
        resp = await services.upstream.open(
            chat_url(replica["url"]), upstream_request_headers(ctx.client_headers, rid, None),
            shadow_body(ctx, shadow), float(tier.get("timeout_s") or 60.0), False)
        try:
            data = orjson.loads(resp.content)
        finally:
            await resp.aclose()
        latency_ms = (time.perf_counter() - started) * 1000.0
        content = data["choices"][0]["message"]["content"] or ""
        as_json = wants_json(ctx.body)
        agreed = verdict(served, content, as_json)
        submit(shadow_event(ctx, shadow, tier, replica, data.get("usage") or {}, agreed,
                            latency_ms, as_json))
        services.metrics.shadow_runs.labels("agreed" if agreed else "disagreed").inc()
        return agreed
    except Exception as exc:  # noqa: BLE001 - a shadow run never touches the answer
        log.warning("request %s: shadow run of %s failed: %s", ctx.request_id, shadow.name,
                    exc)
        try:
            services.metrics.shadow_runs.labels("failed").inc()
        except Exception:  # noqa: BLE001
            pass
        return None
    finally:
        _open -= 1


def offer(ctx: RequestContext, spawn: Callable[[Any], None],
          submit: Callable[[dict], None]) -> None:
    """``Gateway.book``'s hook: when ``ctx`` is to be shadowed (and sampled in, and the
    process has room), ``spawn`` the shadow run. Never raises."""
    global _open
    try:
        found = eligible(ctx)
        if found is None:
            return
        shadow, tier = found
        if random.random() * 100.0 >= shadow.sample_pct:
            return
        served = answer_text(ctx)
        if served is None:
            return
        if _open >= int(ctx.services.config["ADAPTERS_SHADOW_MAX_INFLIGHT"]):
            ctx.services.metrics.shadow_runs.labels("skipped").inc()
            return
        _open += 1   # released by run()
        try:
            spawn(run(ctx, shadow, tier, served, submit))
        except Exception:
            _open -= 1
            raise
    except Exception:  # noqa: BLE001 - the shadow never fails the answer
        log.exception("request %s: shadow offer failed", ctx.request_id)
