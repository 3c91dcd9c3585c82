"""Replica choice from the engines' own KV-cache events (S03 policy ``kv_events``). Pure.

The engines publish which blocks they store and evict (vLLM's ``--kv-events-config``:
``BlockStored`` / ``BlockRemoved`` / ``AllBlocksCleared``, each stored run with its token
ids); an index built from those events says, for a request's chain of index keys, how many
leading blocks each replica holds. The keys are ours, not the engine's hashes (which vLLM
seeds per process): ``app.core.kv_keys.BlockKeys`` rebuilds them from the events' token
ids, cache salt and LoRA name, and the gateway computes the same chain from the prompt's
ids. ``kv_choice`` turns that and the live loads into one replica:

1. replicas within the bounded-load rule of today's policy (load + 1 <= ceil(c x share),
   with the same absolute floor, ``rendezvous.load_bound``) and, when the caller knows how
   many requests each replica was sent (``routed``), within ceil(c x share) of those too
   (no floor: it is the balance over the run, the simulator's max/mean; the gateway's
   index counts a replica that joins from the mean of the others) are candidates;
   when none is, the least loaded relative to its weight wins, as today;
2. among candidates the most matched prefix tokens wins, less what its queue and its
   share of the requests sent cost (``QUEUE_SHARE`` of the prompt per request in flight,
   ``SPREAD_SHARE`` of the prompt at the mean share) and less the prefill it has still to
   do (``pending``: the prompt tokens the gateways sent it unmatched whose first token has
   not come yet, ``PENDING_SHARE`` each): a replica one block ahead but with a long queue
   or a long prefill ahead loses to an idle one, and new conversations on a shared prefix
   go to the holder with the fewest requests instead of piling on one;
3. ties go to the rendezvous order of the request's affinity key, so every gateway process
   with the same index, loads and tally makes the same choice. A request no replica has seen
   (nothing matched) is today's ``sluice_choice`` among the replicas within the bound on
   requests sent (all of them when none is, or without a tally); with an index that is
   stale or empty it is exactly today's ``sluice_choice``.

``match_counts`` is the index walk itself, on any mapping of block hash -> holders, so the
simulator (fed by simulated events), the gateway (Redis) and the tests share it.
"""
from __future__ import annotations

from math import fsum
from typing import Callable, Hashable, Iterable, Mapping, Sequence

from app.core.rendezvous import (LOAD_FLOOR, ReplicaView, hrw_order, load_bound,
                                 orderable, sluice_choice)

# One request in flight ahead costs this share of the request's own prompt in prefill
# tokens (a matched token saves its prefill; a queued request delays it), and a replica's
# share of the requests sent so far costs SPREAD_SHARE x the prompt at the mean. Chosen
# with the simulator on the four workload shapes at 120k and 40k KV tokens and checked on
# workloads of another seed (bench/results/prefix_routing_sim.txt). The first version
# (0.12, no spread term, no bound on requests sent) piled hot prefix branches on the
# replica that held them first (max/mean requests 1.77 on deep_tree); a queue share of
# 0.3 cost 3-8 points of hit rate for balance the bound on requests sent already keeps.
QUEUE_SHARE = 0.03
SPREAD_SHARE = 0.4
# A prompt token the replica has still to prefill ahead of this request costs as much as a
# matched token saves: matched - pending is the prefill this request would not wait for,
# so with the other terms equal the replica with the least prefill ahead of the request's
# own first token wins (NVIDIA Dynamo's KV router weighs the same two quantities). Not
# tuned: on the seed preset it took TTFT p99 from 620-754 ms over 10 draws to 480-535
# (cache_aware 636, the pooled-cache oracle 561; bench/results/prefix_routing_sim.txt).
PENDING_SHARE = 1.0

POLICY_NAME = "kv_events"

# A request's last message of at most this many tokens is left out of the chain it is
# matched on (the gateway: of at most 4 x as many characters, so it need not tokenize it):
# it is the new question of most requests, so its blocks are held nowhere, and where the
# same conversation was sent before only these few blocks of it can be. The simulator
# leaves out a last segment this short the same way.
TAIL_TOKENS = 128


def match_counts(chain: Iterable[tuple[Hashable, float]],
                 holders_of) -> dict[Hashable, float]:
    """Matched leading weight per replica: walk ``chain`` ((block key, weight) in prompt
    order) while a replica holds every block so far. ``holders_of(key)`` returns the
    replica ids that hold ``key`` (any iterable; empty when none)."""
    matched: dict[Hashable, float] = {}
    alive: set | None = None
    for key, weight in chain:
        holders = set(holders_of(key))
        alive = holders if alive is None else alive & holders
        if not alive:
            break
        for r in alive:
            matched[r] = matched.get(r, 0.0) + weight
    return matched


def kv_choice(key: str | Callable[[], str], replicas: Sequence[ReplicaView],
              matched: Mapping[Hashable, float] | None,
              loads: Mapping[Hashable, float] | None = None, c: float = 1.25, *,
              prompt_tokens: float = 0.0, queue_share: float = QUEUE_SHARE,
              floor: float = LOAD_FLOOR,
              routed: Mapping[Hashable, float] | None = None,
              spread_share: float = SPREAD_SHARE,
              pending: Mapping[Hashable, float] | None = None,
              pending_share: float = PENDING_SHARE) -> tuple[ReplicaView | None, str]:
    """(replica, how it was chosen): ``"kv"`` from the index, ``"rendezvous"`` when no
    replica matched anything, ``"fallback"`` when ``matched`` is None (index stale or
    unreachable: the caller says so in telemetry). ``key``: the request's rendezvous key,
    or a function that gives it: it is asked for only to fall back, when nothing matched or
    to break a tie, so where the index decides the gateway does not compute it (a blake2b
    of the static prefix, ~40k instructions a request). ``routed``: requests sent to each
    replica so far (the balance the bound keeps); None leaves only the in-flight bound.
    ``pending``: prompt tokens each replica has still to prefill (sent unmatched, first
    token not come yet); None or empty leaves that term out.

    It runs per request on the gateway's event loop, so with one weight (the usual pool)
    each bound is computed once and the candidates taken in one comprehension.
    ``tests/replica_routing/test_kv_routing.py`` checks it against a plain scan on random
    inputs."""
    if matched is None:
        return sluice_choice(_key(key), replicas, loads, c), "fallback"
    # the replicas rendezvous would order (sums by fsum: the same whatever their order)
    live = orderable(replicas)
    if not live:
        return None, "kv"
    loads = loads or {}
    got = [matched.get(r.id, 0.0) for r in live]
    if not max(got) > 0:
        # nothing to keep: today's choice, among the replicas within the bound on requests
        # sent when there is a tally (new sessions spread from the first request on, so a
        # survivor of a replica loss is not left over the bound with its own sessions)
        return sluice_choice(_key(key), _within_sent(live, routed, c) or replicas, loads,
                             c), "rendezvous"
    n = len(live)
    load = [float(loads.get(r.id, 0.0)) for r in live]
    sent = [float(routed.get(r.id, 0.0)) for r in live] if routed else [0.0] * n
    weights = [r.weight for r in live]
    total, total_sent, total_weight = fsum(load), fsum(sent), fsum(weights)
    w = weights[0]
    if weights.count(w) == n:
        # one weight: one bound on load and one on requests sent (no floor: it is the
        # balance over the run, so it holds over any run length)
        b = load_bound(total, w, total_weight, c, floor)
        if routed is None:
            within = [i for i in range(n) if load[i] + 1.0 <= b]
        else:
            bs = load_bound(total_sent, w, total_weight, c)
            within = [i for i in range(n) if load[i] + 1.0 <= b and sent[i] + 1.0 <= bs]
    else:
        within = _within_weighted(load, sent, weights, total, total_sent, total_weight, c,
                                  floor, routed is not None)
    if not within:
        # every replica over a bound: the least loaded relative to its weight
        least = [(load[i] / weights[i], sent[i] / weights[i]) for i in range(n)]
        return _first(key, live, least, min(least)), "kv"

    prompt = max(float(prompt_tokens), 1.0)
    per_load = queue_share * prompt
    # a replica at the mean of requests sent costs spread_share x the prompt, one at
    # twice the mean twice that: a tie-break between replicas that hold the same shared
    # prefix (new conversations spread), too weak to move a conversation off its history
    per_sent = spread_share * prompt * total_weight / max(total_sent, 1.0)
    score: list = [None] * n
    for i in within:
        w = weights[i]
        value = float(got[i]) - per_load * load[i] / w - per_sent * sent[i] / w
        if pending:
            value -= pending_share * float(pending.get(live[i].id, 0.0)) / w
        score[i] = value
    return _first(key, live, score, max([score[i] for i in within])), "kv"


def _within_weighted(load: list, sent: list, weights: list, total: float, total_sent: float,
                     total_weight: float, c: float, floor: float, bound_sent: bool
                     ) -> list[int]:
    """``kv_choice``'s candidates when the replicas' weights differ: a bound per weight."""
    within = []
    bound: dict[float, float] = {}
    sent_bound: dict[float, float] = {}
    for i, w in enumerate(weights):
        b = bound.get(w)
        if b is None:
            b = bound[w] = load_bound(total, w, total_weight, c, floor)
        if load[i] + 1.0 > b:
            continue
        if bound_sent:
            b = sent_bound.get(w)
            if b is None:
                b = sent_bound[w] = load_bound(total_sent, w, total_weight, c)
            if sent[i] + 1.0 > b:
                continue
        within.append(i)
    return within


def _key(key: str | Callable[[], str]) -> str:
    return key if key.__class__ is str else key()


def _first(key: str | Callable[[], str], live: list[ReplicaView], values: list,
           best) -> ReplicaView:
    """The replica of ``live`` whose value is ``best``; of several, the first in the
    rendezvous order of ``key`` (the only case that needs the key)."""
    if values.count(best) == 1:
        return live[values.index(best)]
    return hrw_order(_key(key), [r for r, v in zip(live, values) if v == best])[0]


def _within_sent(order: Sequence[ReplicaView], routed: Mapping[Hashable, float] | None,
                 c: float) -> list[ReplicaView]:
    """The replicas whose requests sent + 1 stay within ceil(c x share) (none without a
    tally)."""
    if routed is None:
        return []
    total = fsum([float(routed.get(r.id, 0.0)) for r in order])
    weight = fsum([r.weight for r in order])
    return [r for r in order
            if float(routed.get(r.id, 0.0)) + 1.0 <= load_bound(total, r.weight, weight, c)]
