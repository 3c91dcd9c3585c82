"""S03_PREFILL: choose the replica of the tier's pool that serves the request.

Weighted rendezvous hashing with bounded load (``app.core.rendezvous.sluice_choice``, the
policy the simulator and the prefix-routing bench measure): the key is the
session id (header ``X-Sluice-Session`` / ``X-Session-Id`` or the OpenAI ``user``, per
the policy's ``session_key``), else a hash of the static prefix (leading system
messages + tools, cut to ``prefix_key_tokens``), salted with the tenant's cache salt
when the policy isolates its prefix cache. Live loads (in-flight counts of every
gateway + scraped ``num_requests_waiting``) come from Redis (``app.contract.inflight``); with
Redis out the choice is plain rendezvous. A failover before the first byte takes the
next replica in HRW order. Fallback S03_LOCAL_PREFILL takes any live replica without
affinity, or escalates when the tier has none left. A request a LoRA adapter serves
(``app.gateway.adapters``) chooses only among the replicas that loaded it.

The policy's ``replica_choice: kv_events`` chooses from the engines' own KV-cache events
instead (``app.gateway.kv_route``, ``app.core.kv_routing.kv_choice``): the replica whose
cache holds most of the prompt's blocks, within the same load bound and within c x the mean
of the requests the gateways sent per replica, with today's choice as the fallback when
the index is stale (telemetry ``replica_choice``).

The policy's ``replica_choice: round_robin`` replaces all that with plain round-robin over
the healthy replicas (per gateway process, like a Kubernetes Service): the baseline that
``bench/prefix_routing.py`` drives through the same gateway.
"""
from __future__ import annotations

import itertools
import logging
import time

from app.contract.inflight import read_loads_async
from app.core.kv_routing import kv_choice
from app.core.rendezvous import sluice_choice
from app.gateway import adapters, kv_route
from app.gateway.context import RequestContext
from app.gateway.replicas import live_replicas, pick, routing_key, salt, views_of  # noqa: F401

log = logging.getLogger(__name__)
_round_robin: dict[str, itertools.count] = {}   # per tier, this process


class NoReplica(RuntimeError):
    pass


async def _loads(ctx: RequestContext, ids: list) -> dict:
    services = ctx.services
    if services is None or len(ids) < 2:
        return {}
    try:
        return await read_loads_async(services.redis, ids, services.keys)
    except Exception as exc:  # noqa: BLE001 - Redis out: rendezvous without load
        log.debug("replica loads unavailable: %s", exc)
        return {}


async def run(ctx: RequestContext) -> str:
    # a request served by a LoRA adapter goes to the replicas that loaded it
    reps = adapters.replicas_for(ctx, live_replicas(ctx, healthy_only=True))
    if not reps:
        raise NoReplica(f"no healthy replica for tier {ctx.tier['name']}")
    if len(reps) == 1:
        ctx.replica = reps[0]
        return "S04_DECODE"
    if ctx.policy["replica_choice"] == "round_robin":
        turn = next(_round_robin.setdefault(ctx.tier["name"], itertools.count()))
        ctx.replica = sorted(reps, key=lambda r: str(r.get("id") or r["url"]))[turn % len(reps)]
        return "S04_DECODE"
    views, by_id = views_of(reps)
    ctx.kv_unmatched = None
    if ctx.policy["replica_choice"] == "kv_events":
        choice, loads = await _kv_events(ctx, views)
    else:
        loads = await _loads(ctx, [v.id for v in views])
        choice = sluice_choice(routing_key(ctx), views, loads,
                               float(ctx.policy["bounded_load_factor"]))
    ctx.replica = by_id[choice.id]
    ctx.telemetry["replica_load"] = {str(k): v for k, v in loads.items()} if loads else None
    return "S04_DECODE"


async def _kv_events(ctx: RequestContext, views: list):
    """The kv_events policy: matched blocks from the engines' own events, else (tokenizer
    still loading, index stale or unreachable) today's rendezvous, said in telemetry. The
    loads, the index and the requests sent per replica are read in one round trip (one
    script: a round trip each cost more gateway CPU than the rest of the choice). Returns
    (choice, loads)."""
    ids = [v.id for v in views]
    chain, prompt = None, 0
    pool = ctx.snapshot.pools.get(str(ctx.tier.get("pool_id")))
    tokens = kv_route.prompt_tokens(pool.model) if pool and ctx.services else None
    if tokens is not None:
        body = ctx.upstream_body or ctx.body
        arm = adapters.choice(ctx)       # the adapter the chosen replicas all hold, if any
        adapter = arm[0] if arm and any(v.id in arm[1] for v in views) else None
        try:
            chain, prompt = kv_route.request_ids(tokens, body, adapter, salt(ctx) or "")
        except Exception as exc:  # noqa: BLE001 - a template the tokenizer refuses
            log.debug("kv_events: prompt not hashed: %s", exc)
    got = None
    if chain is not None:
        # this process's earlier choices on these replicas ride on the call, so the
        # requests sent the bound reads include all of them
        carry = _carry(ids)
        got = await kv_route.route_inputs(ctx.services, ids, chain, carry)
        if got is None:                          # Redis out: they go with a later call
            for rid, row in carry.items():
                _add(rid, *row)
    if got is not None:
        loads, matched, routed, pending = got
    else:
        loads, matched, routed, pending = await _loads(ctx, ids), None, None, None
    # the rendezvous key only where kv_choice needs it (fallback, nothing matched, a tie)
    choice, how = kv_choice(lambda: routing_key(ctx), views, matched, loads,
                            float(ctx.policy["bounded_load_factor"]), prompt_tokens=prompt,
                            routed=routed, pending=pending)
    ctx.telemetry["replica_choice"] = how
    if matched is not None:
        got = int(matched.get(choice.id, 0))
        ctx.telemetry["kv_matched_tokens"] = got
        ctx.telemetry["kv_prompt_tokens"] = prompt
        _add(choice.id, 1, got, prompt)
        if ctx.stream:
            # the prefill the choice still has to do for it, counted in flight until its
            # first token (a streamed answer is the one whose first token the gateway sees)
            ctx.kv_unmatched = (choice.id, max(0, prompt - got))
    return choice, loads


# Per-process tally of routed / matched / prompt tokens per replica, not yet written:
# the next kv_events call on the replica's pool adds it in Redis before it reads the
# requests sent (``kv_index.read_route_inputs``), so the bound on requests sent lags no
# gateway by more than the choices in flight, at no round trip of its own. (Written once a
# second by a task of its own, the tally lagged: a drill's sequential sessions all saw 0
# and piled 8 of 12 onto one replica, and after it died the survivors' uneven counts
# pushed live sessions off their history; tests/replica_routing/test_replica_loss_kv_live.)
# The matched and prompt tokens (the Routing page's matched share, nothing the choice reads)
# ride along at most once a second per replica: two HINCRBYs fewer in Redis a request.
_pending: dict = {}
_shares_due: dict = {}   # per replica: when its matched and prompt tokens go next
SHARES_EVERY_S = 1.0


def _carry(ids: list) -> dict:
    """This process's tally for the replicas of ``ids``, taken out of ``_pending``: each
    one's requests sent, with its matched and prompt tokens when they are due (else 0 0,
    kept for later)."""
    carry: dict = {}
    now = None
    for rid in ids:
        row = _pending.get(rid)
        if row is None:
            continue
        if now is None:
            now = time.monotonic()
        if now >= _shares_due.get(rid, 0.0):
            del _pending[rid]
            _shares_due[rid] = now + SHARES_EVERY_S
            carry[rid] = row
        elif row[0]:
            carry[rid] = (row[0], 0, 0)
            row[0] = 0
    return carry


def _add(replica_id, routed: int, matched: int, prompt: int) -> None:
    row = _pending.setdefault(replica_id, [0, 0, 0])
    row[0] += routed
    row[1] += matched
    row[2] += prompt


async def local_prefill(ctx: RequestContext) -> str:
    reps = adapters.replicas_for(ctx, live_replicas(ctx, healthy_only=False))
    if not reps:
        ctx.last_error = ctx.last_error or NoReplica(f"tier {ctx.tier['name']} has no replica")
        return "S04_ESCALATE_TIER_UP"
    ctx.replica = reps[0]
    return "S04_DECODE"
