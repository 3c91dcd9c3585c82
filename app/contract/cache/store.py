"""Exact + semantic response cache.

Layout (all under ``<namespace>:cache``):

- ``x:<tenant>:<exact_hash>``  the cached response (JSON), TTL per policy: the exact cache.
- ``b:<tenant>:<composite>``   Redis hash, field request_id -> packed (meta JSON + float32
  vector): the semantic bucket, with ``:v`` (generation, sequence), ``:s`` (request_id ->
  sequence) and ``:e`` (request_id -> expiry) beside it. The composite key (tenant, policy,
  schema version, model, conversation history, entity signature) must match exactly, so a
  lookup reads one bucket and does one numpy product; no scan over other tenants' or other
  entities' vectors (qdrant-client local mode scans everything: ~83 ms at 10k points).
  Entity-free questions of one tenant and system prompt all share one bucket, so a bucket
  holds up to ``BUCKET_CAP`` entries and each process mirrors it (``app.contract.cache.mirror``),
  fetching only what changed since its last lookup.
  An answer whose bucket was empty when it was asked may be stored before anyone has
  embedded it (``store(..., vector_later=True)``): its record carries the text, and the
  first lookup that reaches the bucket embeds it and writes the vector back. Until then the
  entry serves exact repeats only; nothing is ever matched without its vector.
- ``r:<request_id>``           where an entry lives, for eviction by feedback.
- ``t:<tenant>`` / ``w:<tenant>:<workflow>``  request ids, for invalidation.

Qdrant is the durable copy of the semantic index (write-through, payload filter on the
composite key); it serves lookups only when Redis is unreachable. Every public method catches
and logs: an outage is a miss, never an error. A circuit breaker keeps an outage cheap: after
Redis fails to answer, lookups and stores skip it for a pause (``breaker_s``, doubling up to
``BREAKER_MAX_S`` while it stays down) instead of paying a connect timeout per request.
"""
from __future__ import annotations

import itertools
import json
import random
import logging
import os
import struct
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Union

import numpy as np
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from app.contract.cache.keys import CacheKey
from app.contract.keys import Keys
from app.contract.cache.mirror import BucketMirror
from app.core.cache_bound import add_agreement, entry_threshold
from app.core.cache_verify import same_question
from app.core.entities import EntityProfile, profiles_compatible

log = logging.getLogger(__name__)

BUCKET_CAP = 20_000         # entries per semantic bucket in Redis (oldest dropped beyond)
EXPIRED_SWEEP = 32          # expired entries a store removes from its bucket, at most
VERIFY_BATCH = 8            # candidates confirmed per Redis round trip
BREAKER_MAX_S = 30.0        # longest pause before Redis is tried again
FILL_MAX = 64               # pending entries a lookup embeds and writes back, at most
JUDGE_MAX = 32              # candidates above the lowest line a lookup judges, at most
_REDIS_DOWN = (RedisConnectionError, RedisTimeoutError, OSError)

# Adds one entry to a bucket atomically: the sequence number and the zset agree, so a
# mirror that read sequence n has seen every entry up to n. Sweeps expired entries and
# the oldest beyond the cap. KEYS: bucket, :v, :s, :e  ARGV: rid, record, exp, now, ttl,
# cap, new generation token, sweep.
_ADD_LUA = """
local n = redis.call('HINCRBY', KEYS[2], 'n', 1)
redis.call('HSETNX', KEYS[2], 'g', ARGV[7])
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[3], n, ARGV[1])
redis.call('ZADD', KEYS[4], ARGV[3], ARGV[1])
local drop = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', ARGV[4], 'LIMIT', 0, tonumber(ARGV[8]))
for _, rid in ipairs(drop) do
  redis.call('HDEL', KEYS[1], rid); redis.call('ZREM', KEYS[3], rid); redis.call('ZREM', KEYS[4], rid)
end
local over = redis.call('ZCARD', KEYS[3]) - tonumber(ARGV[6])
if over > 0 then
  for _, rid in ipairs(redis.call('ZRANGE', KEYS[3], 0, over - 1)) do
    redis.call('HDEL', KEYS[1], rid); redis.call('ZREM', KEYS[3], rid); redis.call('ZREM', KEYS[4], rid)
  end
end
for i = 1, 4 do
  if redis.call('TTL', KEYS[i]) < tonumber(ARGV[5]) then redis.call('EXPIRE', KEYS[i], ARGV[5]) end
end
return n
"""
# Extends each key's TTL to at least ARGV[1] seconds, never shortens it (EXPIRE GT/NX need
# Redis 7). KEYS: the keys.
# Writes a pending entry's vector back, only while the entry is still in its bucket (not
# evicted, expired or invalidated since), under a new sequence number so every mirror
# fetches the filled record. KEYS: bucket, :v, :s  ARGV: rid, record.
_FILL_LUA = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then return 0 end
local n = redis.call('HINCRBY', KEYS[2], 'n', 1)
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[3], n, ARGV[1])
return n
"""
_EXTEND_LUA = """
for _, k in ipairs(KEYS) do
  if redis.call('TTL', k) < tonumber(ARGV[1]) then redis.call('EXPIRE', k, ARGV[1]) end
end
"""
COLLECTION = "sluice_semantic_cache"
# A vector, or how to make one: a lookup calls it only when the vector can change the answer.
Embedding = Union[np.ndarray, Callable[[], np.ndarray], None]


def _vector(embedding: Embedding) -> np.ndarray | None:
    return embedding() if callable(embedding) else embedding


@dataclass
class CacheHit:
    kind: str                 # "exact" | "semantic"
    similarity: float
    response: dict
    request_id: str           # the request whose answer is served
    cached_at: float = 0.0
    how: str = "exact"        # "exact" | "fast" (word for word) | "verified" (the verifier)
    # drawn for cache verification (``Verification.sample``): served as usual, and
    # generated again upstream off the path (``app.gateway.cache_verify``)
    sampled: bool = False
    tier: str = ""            # the tier that generated the cached answer ("" before it was kept)


@dataclass(frozen=True)
class Verification:
    """How a lookup treats a reworded question (issue 22; ``app.core.cache_verify``).

    ``line``: the tenant's learned cosine for verified rewordings (``app.core.cache_bound``);
    an entry may serve lower, down to ``floor``, only where its own agreements number
    ``entry_needed`` (what the tenant's bound needs; None: never below the line).
    ``verified_only``: paraphrases get only answers that were verified (a validator passed
    them, a fresh answer agreed, or they were produced twice identically); others serve
    exact repeats only. The best candidate judged the same but not served (unverified, or
    below its threshold) is reported in ``notes["candidate"]`` so the miss can check it."""
    line: float
    floor: float = 0.70
    verified_only: bool = True
    # share of verifier-path hits drawn for cache verification (``CacheHit.sampled``): still
    # served, and generated again upstream in the background to check the cached answer
    sample: float = 0.0
    entry_needed: int | None = None


@dataclass
class StoreItem:
    """One answer to keep (``CacheStore.store``'s arguments)."""
    key: CacheKey
    embedding: np.ndarray | None
    response: dict
    request_id: str
    ttl_s: int
    workflow: str | None = None
    vector_later: bool = False
    verified: bool = False    # a validator passed it, or it was produced twice identically
    tier: str = ""            # the tier that generated it (cache verification asks it again)


@dataclass
class CacheStore:
    redis: Any
    namespace: str = "sluice"
    qdrant_url: str = ""
    qdrant_path: str = ""
    _qdrant: Any = field(default=None, repr=False)
    _qdrant_failed: bool = field(default=False, repr=False)
    bucket_cap: int = BUCKET_CAP
    breaker_s: float = 1.0
    _down_until: float = field(default=0.0, repr=False)
    _pause: float = field(default=0.0, repr=False)
    mirror: BucketMirror = field(default_factory=BucketMirror, repr=False)
    _add: Any = field(default=None, repr=False)
    _extend: Any = field(default=None, repr=False)
    _fill: Any = field(default=None, repr=False)
    # Embeds pending entries' texts: (n, d) unit rows. None: this process's encoder.
    embed_texts: Callable[[list[str]], np.ndarray] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self._add = self.redis.register_script(_ADD_LUA)
        self._extend = self.redis.register_script(_EXTEND_LUA)
        self._fill = self.redis.register_script(_FILL_LUA)

    # ---- circuit breaker ----------------------------------------------------------------
    def redis_available(self) -> bool:
        """False while the breaker is open (Redis failed recently): skip it."""
        return time.monotonic() >= self._down_until

    def _redis_failed(self, what: str) -> None:
        first = self._pause == 0.0
        self._pause = min(BREAKER_MAX_S, self._pause * 2 if self._pause else self.breaker_s)
        self._down_until = time.monotonic() + self._pause
        log.warning("cache %s: Redis unreachable; skipping it for %.1f s", what, self._pause,
                    exc_info=first)

    def _redis_ok(self) -> None:
        if self._pause:
            log.info("cache: Redis reachable again")
            self._pause = 0.0

    # ---- keys -------------------------------------------------------------------------
    def _k(self, *parts: object) -> str:
        return Keys(self.namespace).cache(*parts)

    # ---- Qdrant (optional, lazy) --------------------------------------------------------
    def qdrant(self) -> Any:
        if self._qdrant is not None or self._qdrant_failed or not (self.qdrant_url or self.qdrant_path):
            return self._qdrant
        try:
            from qdrant_client import QdrantClient, models
            client = (QdrantClient(url=self.qdrant_url, timeout=2) if self.qdrant_url
                      else QdrantClient(path=self.qdrant_path))
            if not client.collection_exists(COLLECTION):
                client.create_collection(COLLECTION, vectors_config=models.VectorParams(
                    size=384, distance=models.Distance.COSINE))
            if self.qdrant_url:  # local mode has no payload indexes (it scans)
                _ensure_indexes(client, models)
            self._qdrant = client
        except Exception:  # a locked local path, a server down: run on Redis alone
            log.warning("semantic cache: Qdrant unavailable, continuing without it", exc_info=True)
            self._qdrant_failed = True
        return self._qdrant

    def close(self) -> None:
        if self._qdrant is not None:
            try:
                self._qdrant.close()
            except Exception:
                log.debug("qdrant close failed", exc_info=True)
            self._qdrant = None

    # ---- lookup -----------------------------------------------------------------------
    def lookup(self, key: CacheKey, embedding: Embedding, threshold: float, *,
               exact: bool = True, verification: Verification | None = None,
               notes: dict | None = None) -> CacheHit | None:
        """Exact hit first (unless ``exact`` is False: the caller just looked); then the best
        semantic candidate in the key's bucket whose entity guard agrees and whose cosine is
        >= ``threshold``. A key whose text the embedding does not see whole matches
        exactly or not at all.

        ``embedding`` may be a callable that makes the vector: it is called only when the
        key's bucket holds a live entry (or for the Qdrant fallback), so an exact hit or an
        empty bucket costs no embedding."""
        if not key.semantic:
            embedding = None
        if self.redis_available():
            try:
                hit = self._lookup_redis(key, embedding, threshold, exact, verification, notes)
                self._redis_ok()
                return hit
            except _REDIS_DOWN:
                self._redis_failed("lookup")
            except Exception:
                log.warning("cache lookup failed (Redis); trying Qdrant", exc_info=True)
        if verification is not None and verification.verified_only:
            return None  # Qdrant keeps no verification state: exact repeats only meanwhile
        try:
            return self._semantic_qdrant(key, _vector(embedding), threshold) \
                if embedding is not None else None
        except Exception:
            log.warning("cache lookup failed (Qdrant); treating as a miss", exc_info=True)
            return None

    async def alookup_exact(self, aredis: Any, key: CacheKey) -> tuple[CacheHit | None, bool]:
        """The first step of ``lookup`` on an asyncio Redis client, for callers on an event
        loop: (the exact hit, None when there is none; whether the key's bucket exists, i.e.
        whether a semantic lookup could find anything). Raises when the call fails; the
        caller then runs ``lookup``, whose own client decides whether Redis is down (a busy
        async pool is not an outage: opening the breaker here would send every request to
        the Qdrant fallback, which embeds)."""
        bucket = self._k("b", key.tenant_id, key.composite)
        async with aredis.pipeline(transaction=False) as pipe:
            pipe.get(self._k("x", key.tenant_id, key.exact_hash))
            pipe.exists(f"{bucket}:v")
            raw, known = await pipe.execute()
        if raw is not None:
            entry = json.loads(raw)
            return CacheHit("exact", 1.0, entry["response"], entry["request_id"],
                            entry.get("created", 0.0)), True
        if not known:
            self.mirror.forget(bucket)
        return None, bool(known)

    def _lookup_redis(self, key: CacheKey, embedding: Embedding, threshold: float,
                      exact: bool, verification: Verification | None = None,
                      notes: dict | None = None) -> CacheHit | None:
        bucket = self._k("b", key.tenant_id, key.composite)
        known = True
        if exact:
            # the exact entry and whether the bucket exists, in one round trip
            pipe = self.redis.pipeline(transaction=False)
            pipe.get(self._k("x", key.tenant_id, key.exact_hash))
            pipe.exists(f"{bucket}:v")
            raw, known = pipe.execute()
            if raw is not None:
                entry = json.loads(raw)
                return CacheHit("exact", 1.0, entry["response"], entry["request_id"],
                                entry.get("created", 0.0))
        if embedding is None or not known:
            if not known:
                self.mirror.forget(bucket)
            return None
        return self._semantic_redis(key, embedding, threshold, verification, notes)

    def _semantic_redis(self, key: CacheKey, embedding: Embedding, threshold: float,
                        verification: Verification | None = None,
                        notes: dict | None = None) -> CacheHit | None:
        bucket = self._k("b", key.tenant_id, key.composite)
        copy = self.mirror.sync(self.redis, bucket, _unpack)
        now = time.time()
        if copy is None or not copy.has_live(now):
            return None  # nothing the request could match: no vector needed
        vec = _vector(embedding)
        pending = copy.live_pending(now, FILL_MAX)
        if pending:
            self._fill_pending(bucket, copy, pending)
        if verification is None:
            cands = [(row, sim, "fast") for row, sim in copy.candidates(
                vec, threshold, now, lambda prof: profiles_compatible(key.profile, prof))]
        else:
            cands = self._judged(key, copy, vec, threshold, now, verification, notes)
        for i in range(0, len(cands), VERIFY_BATCH):
            batch = cands[i:i + VERIFY_BATCH]
            raws = self.redis.mget([copy.metas[row]["x"] for row, _, _ in batch])
            for (row, sim, how), raw in zip(batch, raws):
                if raw is None:  # evicted or invalidated since the copy was made
                    copy.kill(row)
                    continue
                entry = json.loads(raw)
                if entry.get("request_id") != copy.ids[row]:
                    continue  # the exact entry now holds a newer answer to the same prompt
                sampled = (how == "verified" and verification is not None
                           and verification.sample > 0 and random.random() < verification.sample)
                return CacheHit("semantic", sim, entry["response"], entry["request_id"],
                                entry.get("created", 0.0), how, sampled, entry.get("tier", ""))
        return None

    def _judged(self, key: CacheKey, copy: Any, vec: np.ndarray, threshold: float, now: float,
                verification: Verification, notes: dict | None) -> list[tuple[int, float, str]]:
        """Candidates the request may be served from, best first, each with how it was
        judged: "fast" (word for word, at or above ``threshold``) or "verified" (the
        verifier, at or above the entry's own threshold)."""
        low = min(threshold, verification.floor)
        out = []
        for row, sim in copy.candidates(vec, low, now, lambda prof: True)[:JUDGE_MAX]:
            meta = copy.metas[row]
            prof = meta["_profile"]
            if prof.signature_hash != key.profile.signature_hash:
                continue
            fast = sim >= threshold and profiles_compatible(key.profile, prof)
            if not fast:
                text = meta.get("q")
                if text is None or not same_question(key.text, key.profile, text, prof)[0]:
                    continue
            # an entry's own threshold: the line, or lower on its own evidence (entry_threshold)
            own = entry_threshold(verification.line, _agreements(meta), verification.floor,
                                  verification.entry_needed)
            verified = bool(meta.get("v")) or not verification.verified_only
            if (fast or sim >= own) and verified:
                out.append((row, sim, "fast" if fast else "verified"))
            elif notes is not None and "candidate" not in notes:
                # judged the same, not served: the miss's fresh answer will tell
                notes["candidate"] = {"request_id": copy.ids[row], "similarity": sim,
                                      "x": meta["x"], "served_at": own, "fast": fast}
        return out

    def _fill_pending(self, bucket: str, copy: Any, pending: list[tuple[str, dict]]) -> None:
        """Embed entries stored without a vector and write the vectors back (Redis, and the
        Qdrant copy); entries gone from Redis meanwhile are dropped, not revived."""
        raws = self.redis.mget([meta["x"] for _, meta in pending])
        live = []
        for (rid, meta), raw in zip(pending, raws):
            entry = json.loads(raw) if raw is not None else None
            if entry is None or entry.get("request_id") != rid:
                copy.pending.pop(rid, None)  # evicted, or replaced by a newer answer
                continue
            live.append((rid, meta, entry))
        if not live:
            return
        embed_texts = self.embed_texts
        if embed_texts is None:
            from app.contract.cache.embedding import embed_many as embed_texts
        vecs = embed_texts([meta["t"] for _, meta, _ in live])
        pipe = self.redis.pipeline(transaction=False)
        filled = []
        for (rid, meta, entry), vec in zip(live, vecs):
            meta = {k: v for k, v in meta.items() if k not in ("t", "_profile")}
            self._fill(keys=[bucket, f"{bucket}:v", f"{bucket}:s"],
                       args=[rid, _pack(meta, vec)], client=pipe)
            filled.append((rid, meta, np.asarray(vec, dtype=np.float32), entry))
        done = pipe.execute()
        self.mirror.fill(bucket, copy, [(rid, meta, vec) for (rid, meta, vec, _), n
                                        in zip(filled, done) if n])
        for (rid, meta, vec, entry), n in zip(filled, done):
            copy.pending.pop(rid, None)
            if n:
                self._store_qdrant_entry(meta["composite"], meta["tenant"], meta["profile"],
                                         vec, entry, meta["exp"])

    def _semantic_qdrant(self, key: CacheKey, embedding: np.ndarray | None,
                         threshold: float) -> CacheHit | None:
        client = self.qdrant()
        if client is None or embedding is None:
            return None
        from qdrant_client import models
        now = time.time()
        # Filtered search: the tenant (a tenant-partitioned index on a server), the composite
        # key (entity signature included) and unexpired, all inside the vector search, so
        # expired or foreign points never crowd the live candidates out of the top 8.
        flt = models.Filter(must=[
            models.FieldCondition(key="tenant", match=models.MatchValue(value=key.tenant_id)),
            models.FieldCondition(key="composite", match=models.MatchValue(value=key.composite)),
            models.FieldCondition(key="exp", range=models.Range(gt=now))])
        points = client.query_points(COLLECTION, query=np.asarray(embedding).tolist(),
                                     query_filter=flt, limit=8, with_payload=True,
                                     score_threshold=threshold).points
        for p in points:
            meta = p.payload or {}
            if meta.get("exp", 0) > now and profiles_compatible(
                    key.profile, EntityProfile.from_dict(meta["profile"])):
                return CacheHit("semantic", float(p.score), meta["response"], meta["request_id"],
                                meta.get("created", 0.0))
        return None

    # ---- store ------------------------------------------------------------------------
    def store(self, key: CacheKey, embedding: np.ndarray | None, response: dict, request_id: str,
              ttl_s: int, workflow: str | None = None, *, vector_later: bool = False,
              verified: bool = False, tier: str = "") -> bool:
        """Keep ``response`` (already checked with ``is_cacheable_response``) for ``ttl_s``.
        ``vector_later``: with no ``embedding``, the semantic entry is kept pending (with its
        text), to be embedded by the first lookup that reaches its bucket; without it, an
        answer stored with no embedding serves exact repeats only."""
        return self.store_many([StoreItem(key, embedding, response, request_id, ttl_s,
                                          workflow, vector_later, verified, tier)]) == 1

    def store_many(self, items: list["StoreItem"]) -> int:
        """``store`` for several answers in one Redis round trip; returns how many Redis took."""
        now = time.time()
        todo = []
        for it in items:
            if it.ttl_s <= 0:
                continue
            emb, later = (it.embedding, it.vector_later) if it.key.semantic else (None, False)
            entry = {"response": it.response, "request_id": it.request_id, "created": now,
                     "workflow": it.workflow or ""}
            if it.tier:
                entry["tier"] = it.tier
            todo.append((it, emb, later, entry))
        ok = 0
        if todo and self.redis_available():
            try:
                pipe = self.redis.pipeline(transaction=False)
                for it, emb, later, entry in todo:
                    self._store_redis(it.key, emb, entry, it.request_id, it.ttl_s, it.workflow,
                                      now, later, pipe, it.verified)
                pipe.execute()
                self._redis_ok()
                ok = len(todo)
            except _REDIS_DOWN:
                self._redis_failed("store")
            except Exception:
                log.warning("cache store failed (Redis)", exc_info=True)
        for it, emb, _, entry in todo:
            if emb is not None:
                self._store_qdrant(it.key, emb, entry, now + it.ttl_s, it.workflow)
        return ok

    def _store_redis(self, key: CacheKey, embedding: np.ndarray | None, entry: dict,
                     request_id: str, ttl_s: int, workflow: str | None, now: float,
                     vector_later: bool, pipe: Any, verified: bool = False) -> None:
        xkey = self._k("x", key.tenant_id, key.exact_hash)
        bucket = self._k("b", key.tenant_id, key.composite)
        pipe.set(xkey, json.dumps(entry, separators=(",", ":")), ex=ttl_s)
        pipe.set(self._k("r", request_id), json.dumps({"x": xkey, "b": bucket}), ex=ttl_s)
        index_keys = [self._k("t", key.tenant_id)]
        if workflow:
            index_keys.append(self._k("w", key.tenant_id, workflow))
        for ik in index_keys:
            pipe.sadd(ik, request_id)
        self._extend(keys=index_keys, args=[ttl_s], client=pipe)
        if embedding is not None or vector_later:
            meta = {"x": xkey, "exp": now + ttl_s, "created": now,
                    "profile": key.profile.to_dict(), "q": key.text, "v": int(verified)}
            if embedding is None:  # pending: what the filler needs to embed and index it
                meta.update(t=key.text, composite=key.composite, tenant=key.tenant_id)
                embedding = _NO_VECTOR
            self._add(keys=[bucket, f"{bucket}:v", f"{bucket}:s", f"{bucket}:e"],
                      args=[request_id, _pack(meta, embedding), now + ttl_s, now, ttl_s,
                            self.bucket_cap, _generation_token(), EXPIRED_SWEEP], client=pipe)

    def _store_qdrant(self, key: CacheKey, embedding: np.ndarray, entry: dict, exp: float,
                      workflow: str | None) -> None:
        self._store_qdrant_entry(key.composite, key.tenant_id, key.profile.to_dict(), embedding,
                                 {**entry, "workflow": workflow or ""}, exp)

    def _store_qdrant_entry(self, composite: str, tenant: str, profile: dict,
                            embedding: np.ndarray, entry: dict, exp: float) -> None:
        try:
            client = self.qdrant()
            if client is None:
                return
            from qdrant_client import models
            payload = {**entry, "composite": composite, "tenant": tenant,
                       "workflow": entry.get("workflow") or "", "exp": exp, "profile": profile}
            client.upsert(COLLECTION, [models.PointStruct(
                id=_point_id(entry["request_id"]), vector=np.asarray(embedding).tolist(),
                payload=payload)])
        except Exception:
            log.warning("cache store failed (Qdrant)", exc_info=True)

    # ---- verification state -------------------------------------------------------------
    def mark(self, request_id: str, *, verified: bool | None = None,
             agreed_at: float | None = None) -> bool:
        """Record what verification learned about the entry that answered ``request_id``:
        it is verified (may serve paraphrases), and/or it agreed with a fresh answer at
        cosine ``agreed_at`` (kept as evidence for its own threshold). The record is written
        back under a new sequence number so every process's mirror picks it up. False when
        the entry is gone."""
        try:
            raw = self.redis.get(self._k("r", request_id))
            if raw is None:
                return False
            bucket = json.loads(raw)["b"]
            record = self.redis.hget(bucket, request_id)
            if record is None:
                return False
            meta, vec = _unpack(record)
            if verified is not None:
                meta["v"] = int(verified)
            if agreed_at is not None:
                meta["agr"] = add_agreement(_agreements(meta), agreed_at)
                meta.pop("tau", None)
            meta.pop("_profile", None)
            n = self._fill(keys=[bucket, f"{bucket}:v", f"{bucket}:s"],
                           args=[request_id, _pack(meta, vec)])
            return bool(n)
        except Exception:
            log.warning("cache mark failed", exc_info=True)
            return False

    def exact_response(self, xkey: str) -> dict | None:
        """The answer an exact-cache key holds now (None: gone)."""
        raw = self.redis.get(xkey)
        return None if raw is None else json.loads(raw)

    # ---- eviction / invalidation -----------------------------------------------------------
    def evict(self, request_id: str) -> bool:
        """Drop the entry that answered ``request_id`` (feedback "fail" on a served hit)."""
        found = False
        if self.redis_available():
            try:
                found = self._drop(request_id)
                self._redis_ok()
            except _REDIS_DOWN:
                self._redis_failed("evict")
            except Exception:
                log.warning("cache evict failed (Redis)", exc_info=True)
        self._qdrant_delete("request_id", request_id)
        return found

    def invalidate(self, tenant_id: Any = None, workflow: str | None = None) -> int:
        """Drop a tenant's entries, one workflow's (within ``tenant_id`` when given), or all.
        Returns how many entries were removed from Redis."""
        try:
            if tenant_id is None and workflow is None:
                entries = len(self._scan(self._k("x", "*")))
                self._delete_matching(self._k("*"))
                return entries
            if workflow is None:
                n = self._evict_index(self._k("t", tenant_id))
                self._delete_matching(self._k("b", tenant_id, "*"))  # counted above
                self._qdrant_delete("tenant", str(tenant_id))
                return n
            pattern = self._k("w", "*" if tenant_id is None else tenant_id, workflow)
            n = sum(self._evict_index(k) for k in self._scan(pattern))
            self._qdrant_delete("workflow", workflow, tenant_id)
            return n
        except Exception:
            log.warning("cache invalidate failed", exc_info=True)
            return 0
        finally:
            if tenant_id is None and workflow is None:
                self._qdrant_delete(None, None)

    def _scan(self, pattern: str) -> list[str]:
        return [k.decode() if isinstance(k, bytes) else k
                for k in self.redis.scan_iter(match=pattern, count=1000)]

    def _delete_matching(self, pattern: str) -> int:
        keys = self._scan(pattern)
        for i in range(0, len(keys), 500):
            self.redis.delete(*keys[i:i + 500])
        return len(keys)

    def _drop(self, request_id: str) -> bool:
        """Delete the Redis entry that answered ``request_id`` and its links; False when
        there was none."""
        raw = self.redis.get(self._k("r", request_id))
        if raw is None:
            return False
        loc = json.loads(raw)
        pipe = self.redis.pipeline(transaction=False)
        pipe.delete(loc["x"], self._k("r", request_id))
        _unlink(pipe, loc["b"], request_id)
        pipe.execute()
        return True

    def _evict_index(self, index_key: str) -> int:
        ids = [m.decode() if isinstance(m, bytes) else m for m in self.redis.smembers(index_key)]
        n = sum(self._drop(rid) for rid in ids)
        self.redis.delete(index_key)
        return n

    def _qdrant_delete(self, field_name: str | None, value: str | None, tenant_id: Any = None) -> None:
        try:
            client = self.qdrant()
            if client is None:
                return
            from qdrant_client import models
            if field_name is None:
                client.delete(COLLECTION, models.FilterSelector(filter=models.Filter(must=[])))
                return
            must = [models.FieldCondition(key=field_name, match=models.MatchValue(value=value))]
            if tenant_id is not None:
                must.append(models.FieldCondition(key="tenant",
                                                  match=models.MatchValue(value=str(tenant_id))))
            client.delete(COLLECTION, models.FilterSelector(filter=models.Filter(must=must)))
        except Exception:
            log.warning("cache delete failed (Qdrant)", exc_info=True)


_NO_VECTOR = np.empty(0, dtype=np.float32)


def _ensure_indexes(client: Any, models: Any) -> None:
    """The payload indexes a Qdrant server's filtered search uses; creating one that exists
    is a no-op there, so every process asks (an older collection gains the new ones)."""
    client.create_payload_index(COLLECTION, "tenant", models.KeywordIndexParams(
        type=models.KeywordIndexType.KEYWORD, is_tenant=True))
    for name in ("composite", "workflow", "request_id"):
        client.create_payload_index(COLLECTION, name, models.PayloadSchemaType.KEYWORD)
    client.create_payload_index(COLLECTION, "exp", models.PayloadSchemaType.FLOAT)
_GEN_PREFIX = uuid.uuid4().hex[:16]
_gen_counter = itertools.count()


def _generation_token() -> str:
    """Unique per bucket creation (only the first add of a bucket keeps it): a random
    per-process prefix and a counter, not a uuid4 (an os.urandom call) per write."""
    return f"{_GEN_PREFIX}{os.getpid():x}.{next(_gen_counter):x}"


def _unlink(pipe: Any, bucket: str, request_id: str) -> None:
    pipe.hdel(bucket, request_id)
    pipe.zrem(f"{bucket}:s", request_id)
    pipe.zrem(f"{bucket}:e", request_id)


def _agreements(meta: dict) -> list[float]:
    """The entry's agreement cosines (a record from before they were kept has one, "tau")."""
    if "agr" in meta:
        return [float(x) for x in meta["agr"]]
    return [float(meta["tau"])] if "tau" in meta else []


def _pack(meta: dict, vec: np.ndarray) -> bytes:
    head = json.dumps(meta, separators=(",", ":")).encode()
    return struct.pack("<I", len(head)) + head + np.asarray(vec, dtype=np.float32).tobytes()


def _unpack(packed: bytes) -> tuple[dict, np.ndarray]:
    (n,) = struct.unpack_from("<I", packed)
    return json.loads(packed[4:4 + n]), np.frombuffer(packed[4 + n:], dtype=np.float32)


def _point_id(request_id: str) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"sluice-cache:{request_id}"))
