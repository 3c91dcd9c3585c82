"""Off-path runs: an adapter in shadow and exploration for the router's labels (tier 1),
and the machinery they share with cache verification (``app.gateway.cache_verify``).

After the client has its answer (``Gateway.book``), a request that a higher tier than
tier 1 answered successfully may be sent again to a tier-1 replica, off the path: the
body the routed path would send tier 1 (``routed_for``: S02's minified schema, the compact
grammar on a pool), not streamed, no S00 cache, the tenant's engine cache salt. Tier 1's
answer, its keys expanded as S05 would, is compared with the answer the client got
(``verdict``: JSON per field, text normalized, as ``app.core.concordance``) and booked as a ledger event of its own, kind
``shadow``, priced at tier 1. Two modes, each with its own sampling, cap and metric:

- ``adapter``: a workflow's adapter in shadow (the snapshot entry's ``shadow``), with
  probability ``sample_pct``, on a replica that loaded it; request id
  ``<request id>-shadow``, payload {shadow_of, adapter, tier_rank, agreed}.
  ``adapters.shadow_rollup`` turns those rows into the adapter's concordance and its
  approval gate; once the adapter serves tier 1 they are its router labels too.
- ``explore``: what tier 1 would have served (the base model, or the workflow's promoted /
  canary adapter where a replica holds it) for a request the router can learn from (it
  logged S01's features), with probability policy ``explore_pct``; request id
  ``<request id>-explore``, payload {explore: true, tier_rank, shadow_of, agreed}. The
  cascade's trace reader (``app.cascade.traces``) puts the verdict into the shadowed
  request's ``trace["shadow"]``, so tier 1 gets labels on traffic it never served: without
  them its classifier only ever sees failures and auto traffic never reaches it.

Off-path traffic never touches the client's answer, headers or budget: it runs as a
background task (``start``), reserves and settles nothing (``BudgetGuard`` is not called), at
most ``ADAPTERS_SHADOW_MAX_INFLIGHT`` / ``GATEWAY_EXPLORE_MAX_INFLIGHT`` /
``GATEWAY_CACHE_VERIFY_MAX_INFLIGHT`` at once per process (more are skipped; 0 turns the
mode off), and a failure is logged and counted, never raised. FinOps leaves the off-path
kinds (``shadow``, ``cache_verify``: ``app.ledger.models.OFF_PATH_KINDS``) out of every
budget and total.
"""
from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import anyio
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
ADAPTER, EXPLORE, VERIFY = "adapter", "explore", "cache_verify"
_CAP = {ADAPTER: "ADAPTERS_SHADOW_MAX_INFLIGHT", EXPLORE: "GATEWAY_EXPLORE_MAX_INFLIGHT",
        VERIFY: "GATEWAY_CACHE_VERIFY_MAX_INFLIGHT"}
_SUFFIX = {ADAPTER: "-shadow", EXPLORE: "-explore", VERIFY: "-verify"}
_open = {ADAPTER: 0, EXPLORE: 0, VERIFY: 0}   # off-path calls in flight here, per mode
_NOT_FORWARDED = ("stream", "stream_options", "n")


@dataclass(frozen=True)
class Probe:
    """One off-path run: the model asked, where, and how it is booked."""

    mode: str                           # ADAPTER | EXPLORE | VERIFY
    model: str                          # the engine's model name (base or lora_name)
    tier: Mapping[str, Any]             # tier 1 (VERIFY: the tier asked again)
    replica_ids: frozenset | None       # replicas that may answer (None: any of the pool)
    adapter: str | None = None          # the adapter asked for, if any

    @property
    def suffix(self) -> str:
        return _SUFFIX[self.mode]


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


def _served_above_tier_one(ctx: RequestContext, tier: Mapping[str, Any] | None) -> bool:
    return (ctx.status == 200 and ctx.cache == "miss" and bool(ctx.tier) and not ctx.error
            and tier is not None and ctx.tier.get("rank", 0) > tier["rank"])


def eligible(ctx: RequestContext) -> tuple[ShadowEntry, Mapping[str, Any]] | None:
    """(shadow entry, tier 1) when ``ctx`` is a request to shadow (before sampling)."""
    if ctx.status != 200 or ctx.cache != "miss" or not ctx.tier or ctx.error:
        return None
    shadow = adapters.shadow_for(ctx)
    if shadow is None:
        return None
    tier = adapters.tier_one(ctx.snapshot, shadow.pool_id)
    if not _served_above_tier_one(ctx, tier):
        return None
    return shadow, tier


# --- exploration --------------------------------------------------------------------

def explore_tier(ctx: RequestContext) -> Mapping[str, Any] | None:
    """Tier 1 when exploring it could teach the router something: it is a pool tier the
    tenant may use, and the request logged S01's features (a trace to label)."""
    tiers = ctx.snapshot.tiers
    if not tiers or ctx.router_features is None:
        return None
    first = tiers[0]
    if first.get("upstream_kind") != "pool" or first.get("rank") != 1:
        return None
    allowed = ctx.policy["allowed_tiers"]
    if allowed and first.get("name") not in allowed:
        return None
    return first


def explore_sampled(ctx: RequestContext) -> bool:
    """The request's one draw against policy ``explore_pct`` (made once, kept on ctx, so
    S04 can ask the relay to assemble a stream that will be explored)."""
    if ctx.explore_sampled is None:
        pct = float(ctx.policy.get("explore_pct") or 0.0)
        on = ctx.services is not None and int(ctx.services.config[_CAP[EXPLORE]]) > 0
        ctx.explore_sampled = on and pct > 0 and random.random() * 100.0 < pct
    return ctx.explore_sampled


def may_explore(ctx: RequestContext) -> bool:
    """Before the answer (S04): sampled, on a tier above tier 1, with features logged."""
    tier = explore_tier(ctx)
    return (tier is not None and bool(ctx.tier) and ctx.tier.get("rank", 0) > tier["rank"]
            and explore_sampled(ctx))


def explore_probe(ctx: RequestContext) -> Probe | None:
    """What tier 1 would have served ``ctx`` with, when it is a request to explore (after
    sampling); None otherwise. A request whose tier-1 attempt the margin monitor already
    aborted is known to fail there: not explored."""
    tier = explore_tier(ctx)
    if not _served_above_tier_one(ctx, tier) or not explore_sampled(ctx):
        return None
    if 1 in (ctx.telemetry.get("escalated_from") or ()):
        return None
    return probe_on(ctx, EXPLORE, tier)


def probe_on(ctx: RequestContext, mode: str, tier: Mapping[str, Any]) -> Probe:
    """What ``tier`` serves ``ctx`` with, as S04 would: on tier 1, the workflow's promoted
    or canary adapter arm where a replica holds it; else the tier's base model."""
    entry = adapters.entry_for(ctx)
    first = adapters.tier_one(ctx.snapshot, entry.pool_id) if entry is not None else None
    if first is not None and first.get("name") == tier.get("name"):
        chosen = adapters.arm(entry, replicas.routing_key(ctx))
        if chosen is not None and chosen[1]:
            return Probe(mode, chosen[0], tier, frozenset(chosen[1]), chosen[0])
    return Probe(mode, ctx.snapshot.served_model(tier), tier, None)


# --- the run ------------------------------------------------------------------------

def routed_for(ctx: RequestContext, tier: Mapping[str, Any]) -> tuple[dict[str, Any], Any]:
    """(body, S02's MinifyState or None): what the routed path would send ``tier``. S02's
    work on the client's body (the tools retrieval chose, the minified schema and the
    instructions naming its aliases, on a pool the compact grammar where the policy wants
    it) done for ``tier``: reused when ``tier`` counts tokens as the served tier and is a
    pool as it is, else minified again with ``tier``'s tokenizer (aliases are one token
    in the tokenizer of the model that writes them). The client's body when S02 left it
    as is. CPU work when it minifies again: call it in a worker thread. A probe that sent
    the client's own body would judge tier 1 on a longer answer than routing asks of it
    (full keys: an answer that fits ``max_tokens`` minified may not fit unminified)."""
    body, st = ctx.form_swap[0] if ctx.form_swap is not None \
        else (ctx.upstream_body, ctx.minify)   # S02's, not an adapter's trained form
    source = body if body is not None else ctx.body
    if st is None:
        return source, None
    from app.gateway.request_facts import tokenizer_name
    from app.gateway.stages.s02_minify import minify_body
    pool = tier.get("upstream_kind") == "pool"
    name = tokenizer_name(ctx, tier)
    if name == st.tokenizer and pool == ((ctx.tier or {}).get("upstream_kind") == "pool"):
        return source, st
    got = minify_body(ctx, name, pool)
    return got if got is not None else (source, None)


def probe_body(ctx: RequestContext, model: str, pool: bool = True,
               source: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The request for an off-path run: ``source`` (``routed_for``'s body; the client's
    by default) with the same messages and limits, not streamed; on a pool, with the
    tenant's engine cache salt."""
    body = {k: v for k, v in (ctx.body if source is None else source).items()
            if k not in _NOT_FORWARDED}
    body["model"] = model
    body["stream"] = False
    salt = replicas.salt(ctx) if pool else None
    if salt:
        body["cache_salt"] = salt
    return body


def _replica(ctx: RequestContext, probe: Probe) -> Mapping[str, Any] | None:
    upstream = ctx.services.upstream
    if probe.tier.get("upstream_kind") == "external":
        url = probe.tier.get("endpoint_url")
        return replicas.external_replica(dict(probe.tier)) \
            if url and not upstream.is_ejected(url) else None
    pool = ctx.snapshot.pools.get(str(probe.tier.get("pool_id")))
    reps = [r for r in (pool.replicas if pool else ()) if r.state == "healthy" and r.url
            and not upstream.is_ejected(r.url)]
    if probe.replica_ids is not None:
        holding = [r for r in reps if r.id in probe.replica_ids]
        # an adapter's shadow needs its adapter; exploration, as S03, falls back to the
        # base model on any replica when none holds the workflow's adapter
        if probe.mode == ADAPTER or holding:
            reps = holding
    return replicas.pick(ctx, reps) if reps else None


def off_path_event(ctx: RequestContext, probe: Probe, model: str, usage: dict,
                   latency_ms: float, kind: str, adapter: str,
                   payload: dict[str, Any]) -> LedgerEvent:
    """The ledger event of an off-path run (request id ``<rid><suffix>``), priced at its
    tier; no baseline, no stage savings: it is nobody's request."""
    at = datetime.now(timezone.utc)
    prompt, cached, out = usage_tokens(usage)
    cost = tier_cost(probe.tier, at, prompt, cached, out)
    return {
        "request_id": f"{ctx.request_id}{probe.suffix}", "at": at.isoformat(),
        "tenant_id": ctx.tenant["id"], "workflow": ctx.workflow_signature,
        "workflow_name": ctx.workflow_name, "tier": probe.tier["name"], "model": model,
        "status": 200, "cache": "miss", "prompt_tokens": prompt, "cached_tokens": cached,
        "completion_tokens": out, "cost_usd": f"{cost:f}", "baseline_cost_usd": "0",
        "escalated": False, "ttft_ms": None, "latency_ms": round(latency_ms, 3),
        "usage_source": "upstream", "adapter": adapter, "kind": kind, "payload": payload}


def probe_event(ctx: RequestContext, probe: Probe, model: str, replica: Mapping[str, Any],
                usage: dict, agreed: bool, latency_ms: float, as_json: bool) -> LedgerEvent:
    payload: dict[str, Any] = {"shadow_of": ctx.request_id, "agreed": agreed,
                               "metric": "json_fields" if as_json else "text",
                               "served_tier": ctx.tier.get("name"),
                               "replica": replica.get("name")}
    if probe.mode == ADAPTER:
        # tier_rank: once this adapter serves tier 1, its shadow verdicts are tier-1 labels
        # for the workflow's router (app.cascade.traces.explored_verdicts)
        payload.update(adapter=probe.adapter, tier_rank=int(probe.tier["rank"]))
    else:
        payload.update(explore=True, tier_rank=int(probe.tier["rank"]), model=model,
                       served_rank=ctx.tier.get("rank"),
                       adapter=probe.adapter if model == probe.adapter else None)
    # the adapter column is the adapter shadow's evidence (app.adapters.serving): an
    # exploration run is the router's, named only in its payload
    return off_path_event(ctx, probe, model, usage, latency_ms, "shadow",
                          probe.adapter if probe.mode == ADAPTER else "", payload)


def count(ctx: RequestContext, probe: Probe, outcome: str) -> None:
    """The mode's run counter (``sluice_gateway_{shadow,explore,cache_verify}_runs``)."""
    metrics = ctx.services.metrics
    counter = {ADAPTER: metrics.shadow_runs, EXPLORE: metrics.explore_runs,
               VERIFY: metrics.cache_verify_runs}[probe.mode]
    counter.labels(outcome).inc()


async def generate(ctx: RequestContext, probe: Probe
                   ) -> tuple[Mapping[str, Any], str, dict, float] | None:
    """The off-path call itself, after the client's answer went out: (replica, model asked,
    the completion with its keys expanded as S05 would, latency ms); None when no replica
    may answer (counted). Raises on an upstream failure."""
    await asyncio.sleep(0)  # the client's answer goes out first
    replica = _replica(ctx, probe)
    if replica is None:
        count(ctx, probe, "no_replica")
        return None
    holds = probe.replica_ids is None or replica.get("id") in probe.replica_ids
    model = probe.model if holds else ctx.snapshot.served_model(probe.tier)
    from app.gateway.stages import s02_minify
    form = adapters.form_of(ctx, probe.adapter) if holds else None
    if form is not None and s02_minify.form_applies(ctx, form):
        # an adapter in shadow is judged in the form it learned, as it would be served
        source, st = await anyio.to_thread.run_sync(s02_minify.trained_form, ctx, form,
                                                    probe.tier)
    else:
        source, st = (await anyio.to_thread.run_sync(routed_for, ctx, probe.tier)
                      if ctx.minify is not None else routed_for(ctx, probe.tier))
    started = time.perf_counter()
    resp = await ctx.services.upstream.open(
        chat_url(replica["url"]),
        upstream_request_headers(ctx.client_headers, f"{ctx.request_id}{probe.suffix}",
                                 ctx.services.upstream.api_key(probe.tier)),
        probe_body(ctx, model, probe.tier.get("upstream_kind") != "external", source),
        float(probe.tier.get("timeout_s") or 60.0), False)
    try:
        data = orjson.loads(resp.content)
    finally:
        await resp.aclose()
    latency_ms = (time.perf_counter() - started) * 1000.0
    if st is not None:   # the keys back as S05 gives them (its problems are not ours)
        from app.gateway.stages.s05_expand import expand_choices
        await anyio.to_thread.run_sync(expand_choices, st, data)
    return replica, model, data, latency_ms


async def run_probe(ctx: RequestContext, probe: Probe, served: str,
                    submit: Callable[[dict], None]) -> bool | None:
    """One off-path call and its ledger event; returns the verdict (None: it failed)."""
    try:
        got = await generate(ctx, probe)
        if got is None:
            return None
        replica, model, data, latency_ms = got
        content = data["choices"][0]["message"]["content"] or ""
        as_json = wants_json(ctx.body)
        agreed = verdict(served, content, as_json)
        submit(probe_event(ctx, probe, model, replica, data.get("usage") or {}, agreed,
                           latency_ms, as_json))
        count(ctx, probe, "agreed" if agreed else "disagreed")
        return agreed
    except Exception as exc:  # noqa: BLE001 - an off-path run never touches the answer
        log.warning("request %s: %s run of %s failed: %s", ctx.request_id, probe.mode,
                    probe.model, exc)
        try:
            count(ctx, probe, "failed")
        except Exception:  # noqa: BLE001
            pass
        return None


async def run(ctx: RequestContext, shadow: ShadowEntry, tier: Mapping[str, Any],
              served: str, submit: Callable[[dict], None]) -> bool | None:
    """An adapter's shadow run (``run_probe`` in adapter mode)."""
    probe = Probe(ADAPTER, shadow.name, tier, frozenset(shadow.replicas_loaded), shadow.name)
    return await run_probe(ctx, probe, served, submit)


def start(ctx: RequestContext, probe: Probe, run: Callable[[], Awaitable[Any]],
          spawn: Callable[[Any], None]) -> bool:
    """``spawn`` the run ``run()`` makes when the mode's per-process in-flight cap has room
    (else it is counted "skipped" and nothing runs). False when skipped."""
    if _open[probe.mode] >= int(ctx.services.config[_CAP[probe.mode]]):
        count(ctx, probe, "skipped")
        return False
    _open[probe.mode] += 1
    try:
        spawn(_held(probe.mode, run()))
    except Exception:
        _open[probe.mode] -= 1
        raise
    return True


async def _held(mode: str, run: Awaitable[Any]) -> Any:
    try:
        return await run
    finally:
        _open[mode] -= 1


def _spawn(ctx: RequestContext, probe: Probe, served: str, spawn: Callable[[Any], None],
           submit: Callable[[dict], None]) -> None:
    start(ctx, probe, lambda: run_probe(ctx, probe, served, submit), spawn)


def offer(ctx: RequestContext, spawn: Callable[[Any], None],
          submit: Callable[[dict], None]) -> None:
    """``Gateway.book``'s hook: when ``ctx`` is to be shadowed by an adapter and/or
    explored on tier 1 (and sampled in, and the process has room), ``spawn`` the runs.
    Never raises."""
    for mode, find in ((ADAPTER, _adapter_probe), (EXPLORE, explore_probe)):
        try:
            probe = find(ctx)
            if probe is None:
                continue
            served = answer_text(ctx)
            if served is None:
                continue
            _spawn(ctx, probe, served, spawn, submit)
        except Exception:  # noqa: BLE001 - an off-path run never fails the answer
            log.exception("request %s: %s offer failed", ctx.request_id, mode)


def _adapter_probe(ctx: RequestContext) -> Probe | None:
    found = eligible(ctx)
    if found is None:
        return None
    shadow, tier = found
    if random.random() * 100.0 >= shadow.sample_pct:
        return None
    return Probe(ADAPTER, shadow.name, tier, frozenset(shadow.replicas_loaded), shadow.name)
