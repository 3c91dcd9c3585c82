"""Cluster simulator for prefix-aware replica choice (capacity planning). Pure and fast.

A workload is a list of requests ``{"arrival_ms", "session_id", "segments": [[id, tokens],
...], "output_tokens"}``; the prompt is its segments in order, so two requests share a
cacheable prefix exactly as far as their segment lists agree.

Each replica has:
- a KV cache of ``kv_tokens`` tokens: a radix tree over segments with LRU eviction of
  leaves (RadixAttention / vLLM APC style). Hits count in whole blocks of
  ``block_tokens`` and never the last prompt token (the engine recomputes it for logits).
  Only prompt tokens are cached (a conservative choice: a turn's own output is computed
  again when the next turn sends it back).
- a service model: at most ``concurrency`` sequences at once; prefill runs one request at
  a time (compute bound) at ``prefill_ms_per_token`` per uncached token plus
  ``overhead_ms``; decode costs ``decode_ms_per_token`` per output token in its slot.
  TTFT = wait for a slot + wait for the prefill stream + own prefill.

Policies: round-robin, random, least-loaded (fewest in flight), consistent hashing (ring
of 160 virtual nodes per replica, same key as sluice, no load bound), prefix trie
(production-stack style: longest matched prefix among replicas it was sent to, random
tie-break, never forgets), cache-aware (SGLang-router style: shortest queue when
imbalanced, else best match above ``cache_threshold``, else smallest tree), sluice
(``rendezvous.sluice_choice``, the policy S03 runs, keyed by session id else static-prefix
hash; load = in flight + queued),
kv_events (``kv_routing.kv_choice``, the policy S03 runs with replica_choice kv_events, on an
index fed only by the replicas' stored/removed events, with the requests sent per replica
and the prompt tokens sent unmatched that await their first token; a ``stream_share`` of
the requests stream, and only theirs count there, as in the gateway),
oracle (one pooled cache of replicas x kv_tokens that every replica reads, as if KV moved
for free, with least-loaded dispatch: an upper bound on both hit rate and balance).

Load for max/mean is requests served per replica over the run: it is what a router
controls (every policy sees the same requests), whereas token work would fold each
policy's own cache hits into its balance figure.
"""
from __future__ import annotations

import bisect
import hashlib
import heapq
import random
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

from app.core.kv_routing import TAIL_TOKENS, kv_choice, match_counts
from app.core.rendezvous import ReplicaView, affinity_key, sluice_choice

POLICIES = ("round_robin", "random", "least_loaded", "consistent_hash", "prefix_trie",
            "cache_aware", "sluice", "kv_events", "oracle")


# KV-cache tokens of one seed Tier-1 replica: an 8B FP8 model on an 80 GB H100 at vLLM's
# gpu_memory_utilization 0.9 leaves ~60 GiB for the KV cache; at FP8 KV (64 KiB per token:
# 32 layers x 8 KV heads x 128 dims x K and V) that holds 983,040 tokens. At bf16 KV it is
# half that (--kv-tokens 491520).
DEFAULT_KV_TOKENS = 983_040


@dataclass(frozen=True)
class SimParams:
    replicas: int = 8
    kv_tokens: int = DEFAULT_KV_TOKENS
    block_tokens: int = 16
    prefill_ms_per_token: float = 0.08
    decode_ms_per_token: float = 15.0
    overhead_ms: float = 5.0
    concurrency: int = 32
    bounded_load_c: float = 1.25
    prefix_key_tokens: int = 4500
    seed: int = 1
    # Salts every request's hash key (consistent_hash, sluice, kv_events): another, equally
    # valid rendezvous / ring order. ``simulate_draws`` varies it with ``seed``.
    key_salt: str = ""
    # Share of requests that stream (kv_events' pending prefill counts only those: the
    # gateway sees their first token; a spread subset, the same for every policy)
    stream_share: float = 1.0


class RadixLRU:
    """Segment-granular radix tree of cached prefixes with LRU eviction.

    Nodes are touched leaf-to-root, so a parent is always more recent than its
    descendants and the least recent node is always a leaf: eviction pops the oldest."""

    def __init__(self, capacity: int, events: "Callable[[str, int], None] | None" = None
                 ) -> None:
        self.capacity = capacity
        self.used = 0
        # KV events, as an engine publishes them: ("stored" | "removed", block key) where
        # the key is the node's chained hash (the parent's key and the segment)
        self.events = events
        self.key: dict[int, int] = {0: 0}
        self.child: dict[tuple[int, int], int] = {}      # (parent, segment) -> node
        self.info: dict[int, tuple[int, int, int]] = {}  # node -> (parent, segment, tokens)
        self.lru: OrderedDict[int, None] = OrderedDict()
        self._next = 1                                   # 0 is the root

    def match(self, segs: Sequence[tuple[int, int]]) -> tuple[int, list[int]]:
        node, tokens, path = 0, 0, []
        for seg, n in segs:
            nxt = self.child.get((node, seg))
            if nxt is None:
                break
            node, tokens = nxt, tokens + n
            path.append(nxt)
        return tokens, path

    def _evict_one(self, protected: set[int]) -> bool:
        if not self.lru:
            return False
        node = next(iter(self.lru))
        if node in protected:
            return False
        self.lru.popitem(last=False)
        parent, seg, n = self.info.pop(node)
        del self.child[(parent, seg)]
        self.used -= n
        if self.events is not None:
            self.events("removed", self.key.pop(node))
        return True

    def insert(self, segs: Sequence[tuple[int, int]]) -> int:
        """Look up and cache ``segs``; returns the tokens that were already cached."""
        hit, path = self.match(segs)
        for node in reversed(path):
            self.lru.move_to_end(node)
        protected = set(path)
        parent = path[-1] if path else 0
        new = []
        for seg, n in segs[len(path):]:
            while self.used + n > self.capacity and self._evict_one(protected):
                pass
            if self.used + n > self.capacity:
                break
            node = self._next
            self._next += 1
            self.child[(parent, seg)] = node
            self.info[node] = (parent, seg, n)
            self.used += n
            if self.events is not None:
                self.key[node] = chain_key(self.key[parent], seg)
                self.events("stored", self.key[node])
            new.append(node)
            protected.add(node)
            parent = node
        for node in reversed(new):
            self.lru[node] = None
            self.lru.move_to_end(node)
        for node in reversed(path):
            self.lru.move_to_end(node)
        return hit


def chain_key(parent_key: int, seg: int) -> int:
    """Block key of a segment under its parent's key (the simulator's chained block hash)."""
    return hash((parent_key, seg))


@dataclass
class _Replica:
    cache: RadixLRU
    slots: list = field(default_factory=list)   # heap of slot-free times
    ends: list = field(default_factory=list)    # heap of finish times (in flight)
    starts: list = field(default_factory=list)  # heap of prefill-start times (waiting)
    prefill_free: float = 0.0
    served: int = 0
    busy_ms: float = 0.0                        # sum of (finish - arrival): time in system

    def inflight(self, now: float) -> int:
        while self.ends and self.ends[0] <= now:
            heapq.heappop(self.ends)
        return len(self.ends)

    def waiting(self, now: float) -> int:
        while self.starts and self.starts[0] <= now:
            heapq.heappop(self.starts)
        return len(self.starts)


@dataclass(frozen=True)
class Req:
    arrival_ms: float
    session_id: str | None
    segs: tuple[tuple[int, int], ...]
    output_tokens: int
    prompt_tokens: int
    key: str


def prepare(workload: Sequence[Mapping], prefix_key_tokens: int = 4500) -> list[Req]:
    """Intern segment ids and compute each request's affinity key (session id, else the
    segments that cover the first ``prefix_key_tokens`` tokens)."""
    ids: dict[str, int] = {}
    out = []
    for i, row in enumerate(sorted(workload, key=lambda r: r["arrival_ms"])):
        segs, static, covered = [], [], 0
        for sid, n in row["segments"]:
            segs.append((ids.setdefault(str(sid), len(ids) + 1), int(n)))
            if covered < prefix_key_tokens:
                static.append(f"{sid}:{n}")
                covered += int(n)
        key = affinity_key(row.get("session_id"), "\x1e".join(static), 10**9, fallback=str(i))
        out.append(Req(float(row["arrival_ms"]), row.get("session_id"), tuple(segs),
                       int(row.get("output_tokens", 0)), sum(n for _, n in segs), key))
    return out


def _ring(n: int, vnodes: int = 160) -> tuple[list[int], list[int]]:
    points = sorted((int.from_bytes(hashlib.blake2b(f"replica-{r}#{v}".encode(),
                                                    digest_size=8).digest(), "big"), r)
                    for r in range(n) for v in range(vnodes))
    return [p for p, _ in points], [r for _, r in points]


def _h(key: str) -> int:
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big")


class _Router:
    """Router-side state of one policy; ``choose`` returns a replica index."""

    def __init__(self, name: str, p: SimParams, reps: list[_Replica],
                 index: dict[int, set[int]] | None = None) -> None:
        self.name, self.p, self.reps = name, p, reps
        self.index = index          # kv_events: block key -> replicas, from their events
        # kv_events: prompt tokens sent unmatched per replica whose first token has not come
        # (the gateway's in-flight tracker), released at their first token
        self.pending = {i: 0.0 for i in range(p.replicas)}
        self.pending_q: list = []   # heap of (first token at, replica, tokens)
        self.unmatched = 0.0        # the last kv_events choice's prompt tokens not matched
        self.rng = random.Random(p.seed)
        # after the key: its "s:" / "p:" kind decides how many choices sluice_choice weighs
        self.salt = f"|{p.key_salt}" if p.key_salt else ""
        self.rr = 0
        self.views = [ReplicaView(id=i) for i in range(p.replicas)]
        if name == "consistent_hash":
            self.ring = _ring(p.replicas)
        if name == "prefix_trie":
            self.trie: dict[tuple, set[int]] = {}
        if name == "cache_aware":
            # Approximate per-worker trees the router keeps from what it sent (not the
            # engine's real cache); sized like sglang-router's max_tree_size (2**26 chars).
            self.trees = [RadixLRU(2**26 // 4) for _ in range(p.replicas)]

    def _least_loaded(self, now: float) -> int:
        loads = [r.inflight(now) for r in self.reps]
        low = min(loads)
        return self.rng.choice([i for i, v in enumerate(loads) if v == low])

    def choose(self, req: Req, now: float) -> int:
        n = self.p.replicas
        if self.name == "round_robin":
            self.rr += 1
            return (self.rr - 1) % n
        if self.name == "random":
            return self.rng.randrange(n)
        if self.name in ("least_loaded", "oracle"):
            return self._least_loaded(now)
        if self.name == "consistent_hash":
            points, owners = self.ring
            return owners[bisect.bisect(points, _h(req.key + self.salt)) % len(points)]
        if self.name == "sluice":
            # as in production: in-flight plus queued (vllm:num_requests_waiting), and
            # the very policy S03 runs
            loads = {i: r.inflight(now) + r.waiting(now) for i, r in enumerate(self.reps)}
            return sluice_choice(req.key + self.salt, self.views, loads,
                                 self.p.bounded_load_c).id
        if self.name == "kv_events":
            return self._kv_events(req, now)
        if self.name == "prefix_trie":
            return self._prefix_trie(req)
        return self._cache_aware(req, now)

    def _kv_events(self, req: Req, now: float) -> int:
        # the policy S03 runs with replica_choice kv_events, on an index fed only by the
        # replicas' stored/removed events; loads as for sluice, and the requests sent to
        # each replica so far
        chain, key = [], 0
        segs = req.segs
        if segs and segs[-1][1] <= TAIL_TOKENS:    # as the gateway: not matched
            segs = segs[:-1]
        for seg, n in segs:
            key = chain_key(key, seg)
            chain.append((key, n))
        empty: set[int] = set()
        matched = match_counts(chain, lambda k: self.index.get(k, empty))
        loads = {i: r.inflight(now) + r.waiting(now) for i, r in enumerate(self.reps)}
        # requests sent so far: the gateway's own tally (app.contract.kv_index)
        routed = {i: r.served for i, r in enumerate(self.reps)}
        q = self.pending_q
        while q and q[0][0] <= now:
            _, rep, tokens = heapq.heappop(q)
            self.pending[rep] -= tokens
        choice = kv_choice(req.key + self.salt, self.views, matched, loads,
                           self.p.bounded_load_c, prompt_tokens=req.prompt_tokens,
                           routed=routed, pending=self.pending)[0].id
        # as the gateway: the prompt it did not find on the choice, by the index
        self.unmatched = max(0.0, req.prompt_tokens - matched.get(choice, 0.0))
        return choice

    def _prefix_trie(self, req: Req) -> int:
        # production-stack style: longest matched prefix wins, random among the replicas
        # that were sent it; the trie only grows (it never learns about evictions).
        best: set[int] = set()
        path: tuple = ()
        for seg, _ in req.segs:
            path += (seg,)
            hit = self.trie.get(path)
            if not hit:
                break
            best = hit
        choice = self.rng.choice(sorted(best)) if best else self.rng.randrange(self.p.replicas)
        path = ()
        for seg, _ in req.segs:
            path += (seg,)
            self.trie.setdefault(path, set()).add(choice)
        return choice

    def _cache_aware(self, req: Req, now: float, cache_threshold: float = 0.5,
                     abs_threshold: int = 32, rel_threshold: float = 1.0001) -> int:
        # SGLang-router style: shortest queue when imbalanced, else the best prefix match
        # if it covers more than cache_threshold of the prompt, else the smallest tree.
        loads = [r.inflight(now) for r in self.reps]
        hi, lo = max(loads), min(loads)
        if hi - lo > abs_threshold and hi > rel_threshold * lo:
            choice = loads.index(lo)
        else:
            matches = [t.match(req.segs)[0] for t in self.trees]
            best = max(range(len(matches)), key=lambda i: (matches[i], -loads[i]))
            if matches[best] > cache_threshold * req.prompt_tokens:
                choice = best
            else:
                choice = min(range(len(self.trees)), key=lambda i: (self.trees[i].used, i))
        self.trees[choice].insert(req.segs)
        return choice


def _publisher(index: dict[int, set[int]], replica: int) -> Callable[[str, int], None]:
    """Replica ``replica``'s KV events applied to the router's index (the subscriber)."""
    def apply(kind: str, key: int) -> None:
        if kind == "stored":
            index.setdefault(key, set()).add(replica)
        else:
            holders = index.get(key)
            if holders is not None:
                holders.discard(replica)
                if not holders:
                    del index[key]
    return apply


def _streams(i: int, share: float) -> bool:
    """Whether request ``i`` streams: a spread ``share`` of the requests (Knuth's
    multiplicative hash of the index), the same for every policy and draw."""
    return share >= 1.0 or (i * 2654435761) % 1000 < 1000 * share


def simulate_policy(name: str, reqs: Sequence[Req], p: SimParams) -> dict:
    """One policy over the whole workload; returns its figures."""
    import numpy as np   # here, so the CLI that reads DEFAULT_KV_TOKENS loads without it
    index: dict[int, set[int]] = {}
    if name == "oracle":   # one pooled cache every replica reads (free KV transfer)
        pooled = RadixLRU(p.kv_tokens * p.replicas)
        reps = [_Replica(pooled) for _ in range(p.replicas)]
    elif name == "kv_events":
        reps = [_Replica(RadixLRU(p.kv_tokens, _publisher(index, i))) for i in range(p.replicas)]
    else:
        reps = [_Replica(RadixLRU(p.kv_tokens)) for _ in range(p.replicas)]
    for r in reps:
        r.slots = [0.0] * p.concurrency
    router = _Router(name, p, reps, index)
    hit_total = prompt_total = 0
    ttft = np.empty(len(reqs))
    for i, req in enumerate(reqs):
        now = req.arrival_ms
        choice = router.choose(req, now)
        rep = reps[choice]
        cached = rep.cache.insert(req.segs)
        usable = (req.prompt_tokens - 1) // p.block_tokens * p.block_tokens
        hit = min(cached // p.block_tokens * p.block_tokens, max(0, usable))
        hit_total += hit
        prompt_total += req.prompt_tokens
        slot_at = max(now, heapq.heappop(rep.slots))
        start = max(slot_at, rep.prefill_free)
        first = start + p.overhead_ms + p.prefill_ms_per_token * (req.prompt_tokens - hit)
        rep.prefill_free = first
        end = first + p.decode_ms_per_token * req.output_tokens
        heapq.heappush(rep.slots, end)
        heapq.heappush(rep.ends, end)
        heapq.heappush(rep.starts, start)
        rep.served += 1
        rep.busy_ms += end - now
        ttft[i] = first - now
        if name == "kv_events" and _streams(i, p.stream_share):
            router.pending[choice] += router.unmatched
            heapq.heappush(router.pending_q, (first, choice, router.unmatched))
    served = np.array([r.served for r in reps], dtype=float)
    busy = np.array([r.busy_ms for r in reps], dtype=float)
    return {"hit_rate": round(hit_total / max(1, prompt_total), 4),
            "max_over_mean_load": round(float(served.max() / max(served.mean(), 1e-9)), 3),
            # time-averaged requests in the system per replica (Little's law), max/mean
            "max_over_mean_inflight": round(float(busy.max() / max(busy.mean(), 1e-9)), 3),
            "ttft_p50_ms": round(float(np.percentile(ttft, 50)), 1) if len(reqs) else 0.0,
            "ttft_p99_ms": round(float(np.percentile(ttft, 99)), 1) if len(reqs) else 0.0}


def simulate(workload: Sequence[Mapping], params: SimParams | None = None,
             policies: Sequence[str] = POLICIES,
             progress: Callable[[str], None] | None = None) -> dict:
    """Every policy over the same workload: ``{"policies": {name: figures}, ...}``."""
    p = params or SimParams()
    return _simulate(prepare(workload, p.prefix_key_tokens), p, policies, progress)


def _simulate(reqs: Sequence[Req], p: SimParams, policies: Sequence[str],
              progress: Callable[[str], None] | None) -> dict:
    out = {}
    for name in policies:
        if name not in POLICIES:
            raise ValueError(f"unknown policy {name!r}")
        out[name] = simulate_policy(name, reqs, p)
        if progress:
            progress(name)
    return {"policies": out, "requests": len(reqs), "replicas": p.replicas,
            "kv_tokens": p.kv_tokens, "load_unit": "requests served per replica",
            "prompt_tokens": sum(r.prompt_tokens for r in reqs)}


# Policies whose run depends on neither the hash salt nor the random seed: one draw is all.
DRAW_INVARIANT = frozenset({"round_robin", "cache_aware"})
DRAW_FIGURES = ("hit_rate", "max_over_mean_load", "ttft_p50_ms", "ttft_p99_ms")


def simulate_draws(workload: Sequence[Mapping], params: SimParams | None = None,
                   policies: Sequence[str] = POLICIES, draws: int = 1,
                   progress: Callable[[str], None] | None = None) -> dict:
    """``simulate`` (draw 0, exactly), then ``draws - 1`` more runs of the same workload
    with the hash keys salted and the random seed moved (draw k: salt ``str(k)``, seed +
    k). One changed choice reorders every later one, so a tail figure such as TTFT p99 of
    one run is one draw of a spread that can exceed the gap between two policies
    (bench/results/prefix_routing_sim.txt). Adds ``"draws"``: per policy, each figure's
    value in every draw, in draw order."""
    from dataclasses import replace
    p = params or SimParams()
    if draws <= 1:
        return simulate(workload, p, policies, progress)
    reqs = prepare(workload, p.prefix_key_tokens)
    first = _simulate(reqs, p, policies,
                      (lambda name: progress(f"draw 1 of {draws}: {name}")) if progress else None)
    out = {name: {f: [fig[f]] for f in DRAW_FIGURES}
           for name, fig in first["policies"].items()}
    for k in range(1, draws):
        pk = replace(p, key_salt=str(k), seed=p.seed + k)
        for name in first["policies"]:
            fig = first["policies"][name] if name in DRAW_INVARIANT else \
                simulate_policy(name, reqs, pk)
            for f in DRAW_FIGURES:
                out[name][f].append(fig[f])
        if progress:
            progress(f"draw {k + 1} of {draws} done")
    return {**first, "draws": out}


def best_non_oracle(result: Mapping) -> tuple[str, float]:
    pols = {k: v for k, v in result["policies"].items() if k != "oracle"}
    name = max(pols, key=lambda k: pols[k]["hit_rate"])
    return name, pols[name]["hit_rate"]
