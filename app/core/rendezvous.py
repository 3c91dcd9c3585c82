"""Replica choice for stage S03: weighted rendezvous (highest-random-weight) hashing with
bounded load. Pure: plain data in, plain data out, no I/O.

Every gateway process that holds the same replica view and the same loads picks the same
replica for the same key, with no shared state: the order is a function of (key, replica id,
weight) only. Hashes are blake2b (stable across processes and Python versions), never
``hash()``.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Hashable, Iterable, Mapping, Sequence

# When the static prefix arrives as text, this many characters stand for one token
# (the usual ~4 chars/token of BPE tokenizers on English and JSON).
CHARS_PER_TOKEN = 4
_TWO64 = float(1 << 64)


@dataclass(frozen=True)
class ReplicaView:
    """What the picker needs to know about one replica (from the gateway snapshot)."""

    id: Hashable
    url: str = ""
    weight: float = 1.0
    healthy: bool = True

    @classmethod
    def from_snapshot(cls, row: Mapping) -> "ReplicaView":
        """From a replica row of ``build_snapshot()['pools'][..]['replicas']``."""
        return cls(id=row["id"], url=row.get("url", ""), weight=float(row.get("weight") or 1.0),
                   healthy=row.get("state") == "healthy")


def _h64(*parts: str) -> int:
    digest = hashlib.blake2b("\x1f".join(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def hrw_score(key: str, replica_id: str, weight: float) -> float:
    """``-w / ln(u)`` with u uniform in (0, 1) from (key, the replica id's text): the
    weighted-rendezvous score, under which replica i wins a key with probability
    w_i / sum(w)."""
    u = (_h64(key, replica_id) + 0.5) / _TWO64
    return -weight / math.log(u)


def orderable(replicas: Iterable[ReplicaView]) -> list[ReplicaView]:
    """The replicas ``hrw_order`` orders: healthy and positively weighted, in input order."""
    return [r for r in replicas if r.healthy and r.weight > 0]


def hrw_order(key: str, replicas: Iterable[ReplicaView]) -> list[ReplicaView]:
    """Healthy, positively weighted replicas, best first for ``key``. Ties (astronomically
    rare) break on the replica id's text so the order never depends on input order."""
    live = orderable(replicas)
    return [live[i] for i in _hrw_positions(key, tuple([(r.id, r.weight) for r in live]))]


@lru_cache(maxsize=16384)
def _hrw_positions(key: str, live: tuple[tuple[Hashable, float], ...]) -> tuple[int, ...]:
    """``hrw_order`` as positions in ``live`` ((id, weight) per replica). Kept per
    (key, replicas): S03 runs it per request (a blake2b and a log per replica), and a
    session's turns and a prefix's requests ask again with the same replicas. (Ids equal
    as values, 1 and 1.0, share an entry: a pool's replica ids are of one type.)"""
    def order(i: int) -> tuple[float, str]:
        rid = str(live[i][0])
        return -hrw_score(key, rid, live[i][1]), rid
    return tuple(sorted(range(len(live)), key=order))


def load_bound(total_load: float, weight: float, total_weight: float, c: float,
               floor: float = 0.0) -> float:
    """Most load replica may carry after taking this request: ``ceil(c * share)`` where
    share = (total + 1) * w / W is its capacity share of the load including this request
    (with equal weights, c x mean). The ceiling is the bounded-load consistent-hashing rule
    (Mirrokni et al.): without it an idle cluster would count every replica as overloaded.
    ``floor`` raises the bound to an absolute load a replica carries at no cost (requests
    it batches anyway), so that a near-idle cluster does not spill on one collision."""
    return max(math.ceil(c * (total_load + 1.0) * weight / total_weight), floor * weight)


def pick_replica(key: str, replicas: Sequence[ReplicaView],
                 loads: Mapping[Hashable, float] | None = None,
                 c: float = 1.25, *, choices: int | None = 1,
                 floor: float = 0.0) -> ReplicaView | None:
    """The first replica in ``hrw_order(key)`` whose load + 1 stays within
    ``load_bound``; when every healthy replica is over, the least loaded relative to its
    weight. None when no replica is healthy. ``loads`` missing an id counts as 0.

    ``choices`` > 1 (None: all) takes the least loaded, relative to weight, of the first
    ``choices`` replicas within the bound, ties to the earlier one in HRW order. Use it
    for static-prefix keys: a prefix is cheap to hold on every replica (it is one system
    prompt), so single-shot requests can absorb imbalance and leave session-keyed requests,
    whose history is expensive to move, on their first choice."""
    order = hrw_order(key, replicas)
    if not order:
        return None
    loads = loads or {}

    def rel(ir: tuple[int, ReplicaView]) -> tuple[float, int]:
        return float(loads.get(ir[1].id, 0.0)) / ir[1].weight, ir[0]

    total = sum(float(loads.get(r.id, 0.0)) for r in order)
    total_weight = sum(r.weight for r in order)
    want = len(order) if choices is None else max(1, choices)
    within = []
    for r in order:
        if float(loads.get(r.id, 0.0)) + 1.0 <= load_bound(total, r.weight, total_weight, c,
                                                            floor):
            within.append(r)
            if len(within) >= want:
                break
    return min(enumerate(within or order), key=rel)[1]


# Sluice's replica-choice policy, the one S03 runs, the simulator's "sluice" policy and
# bench/prefix_routing.py (through the gateway) measure. Chosen with the simulator on the
# seed preset (8 replicas, several RNG seeds): sending static-prefix keys to only their top
# two replicas piles a hot team onto two replicas (max/mean load ~1.5), and without a load
# floor the ceil(c x mean) bound moves sessions off their warm replica at ordinary load
# (~2 points of hit rate lost to history recomputed elsewhere).
SESSION_CHOICES = 1          # a session stays on its first replica within the bound
PREFIX_CHOICES: int | None = None   # any other key: the least loaded replica within it
# In-flight requests under which a replica never counts as over the bound: a serving
# engine batches that many sequences per step at almost no cost to each (vLLM's
# max_num_seqs is 256 by default; the simulator's replicas run 32).
LOAD_FLOOR = 16.0


def choices_for_key(key: str) -> int | None:
    """``pick_replica(choices=)`` for an ``affinity_key``: a session's history lives on one
    replica and is expensive to rebuild elsewhere, whereas a static prefix is one system
    prompt that every replica holds after its first request, so those requests are the
    ones that absorb imbalance."""
    return SESSION_CHOICES if key.startswith("s:") else PREFIX_CHOICES


def sluice_choice(key: str, replicas: Sequence[ReplicaView],
                  loads: Mapping[Hashable, float] | None = None,
                  c: float = 1.25) -> ReplicaView | None:
    """The replica Sluice sends a request with rendezvous key ``key`` to."""
    return pick_replica(key, replicas, loads, c, choices=choices_for_key(key),
                        floor=LOAD_FLOOR)


def _norm_prefix(static_prefix: str | Sequence[int] | None, prefix_key_tokens: int) -> str:
    if static_prefix is None:
        return ""
    if isinstance(static_prefix, str):
        return "t:" + static_prefix[: prefix_key_tokens * CHARS_PER_TOKEN]
    return "i:" + ",".join(str(int(t)) for t in list(static_prefix)[:prefix_key_tokens])


def affinity_key(session_id: str | None, static_prefix: str | Sequence[int] | None,
                 prefix_key_tokens: int = 4500, *, salt: str = "",
                 fallback: str = "") -> str:
    """The rendezvous key of a request.

    The session id when there is one (every turn of a conversation lands on the replica
    that holds its history); else a blake2b of the static prefix (system prompt + tool
    definitions), cut to ``prefix_key_tokens`` token ids or, for text, that many tokens
    at ``CHARS_PER_TOKEN``. ``salt`` is the tenant's cache salt when the policy isolates
    its prefix cache (its prefixes cannot be shared with other tenants, so neither is the
    key). With neither session nor prefix, ``fallback`` (e.g. the request id) spreads the
    request like random choice would.
    """
    if session_id:
        return f"s:{salt}:{session_id}"
    body = _norm_prefix(static_prefix, prefix_key_tokens)
    if not body:
        return f"r:{fallback}"
    digest = hashlib.blake2b(f"{salt}\x1f{body}".encode(), digest_size=16).hexdigest()
    return f"p:{digest}"
