"""S00_CACHE_PROBE: exact, then semantic cache lookup (``app.cache``).

A hit sets ``ctx.cache`` ("exact" | "semantic") and ``ctx.cached_response`` and goes to
RESPOND (cost 0); a miss goes on to S01 and, once the answer is complete,
``on_complete`` queues its write for the process's cache-writer thread (no thread hop per
answer). The lookups are synchronous, so they run in a worker thread. The embedding (the one per request, ``ctx.embedding``,
which the router reuses) is made only when it can change the answer: not on an exact hit,
and not when the key's bucket holds no live entry (then nothing could match by meaning).
A miss that skipped it is stored with its text instead of a vector: the first later request
that reaches the same bucket embeds it (``CacheStore`` fills pending entries), so an answer
nobody asks about again is never embedded at all. Embeddings go through the process's
micro-batcher (``app.contract.cache.batcher``): concurrent requests share one encoder call.

Nothing runs for a request that is not cacheable (cache off, temperature above the
policy's bound, n > 1).

Verified cache (issue 22): a reworded question is judged by the verifier
(``app.core.cache_verify``) and served only from a verified entry at or above the entry's
own threshold (the tenant's learned line, ``app.core.cache_bound``, or lower where the entry
itself agreed). A candidate judged the same but not served is noted on the request; once
the miss has its answer, the cache writer compares the two (``_check_candidate``): agreeing,
the cached entry becomes verified and its threshold comes down to this cosine, and the new
answer is stored verified (it was produced twice); disagreeing, the entry is evicted. A
verifier hit drawn for cache verification (policy ``cache_verify_sample_pct``) is served
like any hit and noted ``cache_hit.sampled``; after the answer, ``app.gateway.cache_verify``
generates it again upstream off the path and ``GatewayCache.learn`` applies the verdict the
same way. Each comparison is evidence for the tenant's line (``app.contract.cache.quality``).
"""
from __future__ import annotations

import json
import logging
import queue
import threading
from collections import deque
from typing import Any

import anyio

from app.contract.cache.keys import build_key, is_cacheable_request, is_cacheable_response
from app.core.cache_bound import answers_agree, min_observations
from app.contract.keys import Keys
from app.gateway.context import GatewayServices, RequestContext
from app.gateway.request_facts import embedding

log = logging.getLogger(__name__)
SERVED_TTL_S = 8 * 86400  # how long feedback on a served hit can find its entry
WRITE_QUEUE_MAX = 10_000  # answers waiting for their cache write, at most
WRITE_BATCH = 64          # answers the cache writer sends in one Redis round trip
CACHE_ASYNC_CONNECTIONS = 64   # the probe's own async Redis pool
INLINE_KEY_CHARS = 2_000  # requests up to this much text get their key built on the loop


class GatewayCache:
    """The worker's cache store (sync Redis client, Qdrant write-through), built lazily."""

    def __init__(self, config: dict[str, Any]) -> None:
        from app.contract.cache.embedding import configure_from
        self.config = config
        self._store = None
        self._lock = threading.Lock()
        self._aredis = None
        self._writes: queue.SimpleQueue = queue.SimpleQueue()
        self._writer: threading.Thread | None = None
        self._dropped: set[str] = set()      # answers refused while their write was queued
        self._dropped_order: deque[str] = deque()
        self._quality = None
        configure_from(config)  # how this process embeds (the router's embedding too)

    # ---- background writes: one thread, no hop per answer ---------------------------------
    def write_later(self, ctx: RequestContext, response: dict) -> bool:
        """Queue the answer's cache write (False when the queue is full: Redis is not
        keeping up, and a cache may skip a write)."""
        if self._writes.qsize() >= WRITE_QUEUE_MAX:
            return False
        if self._writer is None:
            with self._lock:
                if self._writer is None:
                    self._writer = threading.Thread(target=self._write_forever,
                                                    name="cache-writer", daemon=True)
                    self._writer.start()
        self._writes.put((ctx, response))
        return True

    def refuse(self, request_id: str) -> None:
        """Feedback said this answer failed: if its write is still queued, skip it."""
        with self._lock:
            self._dropped.add(request_id)
            self._dropped_order.append(request_id)
            while len(self._dropped_order) > WRITE_QUEUE_MAX:
                self._dropped.discard(self._dropped_order.popleft())

    def _write_forever(self) -> None:
        """Writes what queued, up to WRITE_BATCH answers a Redis round trip."""
        while True:
            items = [self._writes.get()]
            while items[-1] is not None and len(items) < WRITE_BATCH:
                try:
                    items.append(self._writes.get_nowait())
                except queue.Empty:
                    break
            stop = items[-1] is None
            todo = [(ctx, response) for ctx, response in (it for it in items if it is not None)
                    if ctx.request_id not in self._dropped]
            batch = [_store_item(ctx, response, self._check_candidate(ctx, response))
                     for ctx, response in todo]
            try:
                self.store.store_many(batch)
            except Exception:  # noqa: BLE001 - a cache write never fails anything
                log.exception("cache write of %d answers failed", len(batch))
            if stop:
                return

    def _check_candidate(self, ctx: RequestContext, response: dict) -> bool:
        """A miss that had a candidate judged the same but not served: compare its fresh
        answer with the candidate's. True when they agree (the new answer is then stored
        verified: produced twice). Never raises."""
        cand = ctx.telemetry.get("cache_candidate")
        if not cand:
            return False
        try:
            store, tenant, wf = self.store, ctx.tenant["id"], ctx.workflow_signature or None
            rid, sim = cand["of_request"], float(cand["similarity"])
            loc = store.redis.get(Keys(self.config["REDIS_NAMESPACE"]).cache("r", rid))
            entry = store.exact_response(json.loads(loc)["x"]) if loc else None
            if entry is None or entry.get("request_id") != rid:
                return False  # gone meanwhile: nothing to learn
            agreed = answers_agree(entry["response"], response, exact=exact_answer(ctx.body))
            self.learn(tenant, wf, rid, sim, agreed, "check")
            ctx.telemetry["cache_candidate"]["agreed"] = agreed
            return agreed
        except Exception:  # noqa: BLE001 - learning never fails a write
            log.exception("request %s: cache candidate check failed", ctx.request_id)
            return False

    def learn(self, tenant: Any, workflow: str | None, request_id: str, similarity: float,
              agreed: bool, source: str, cost_usd_micros: int = 0) -> str:
        """A fresh answer compared with the entry that answered ``request_id`` (met at
        cosine ``similarity``): evidence for the tenant's line (``source``: "check", a miss's
        candidate; "sample", a served hit generated again), then the entry verified with its
        threshold down to this cosine, or evicted. Returns what happened to the entry:
        "verified", "evicted" or "gone" (expired or evicted meanwhile). Sync Redis."""
        self.quality.observe(tenant, workflow, similarity, agreed, source, cost_usd_micros)
        if agreed:
            if self.store.mark(request_id, verified=True, agreed_at=similarity):
                self.quality.count(tenant, workflow, "verified")
                return "verified"
        elif self.store.evict(request_id):
            self.quality.count(tenant, workflow, "evicted")
            return "evicted"
        return "gone"

    @property
    def quality(self):
        """The verified cache's evidence and counters (sync Redis, the store's client)."""
        if self._quality is None:
            from app.contract.cache.quality import CacheQuality
            self._quality = CacheQuality(self.store.redis, self.config["REDIS_NAMESPACE"])
        return self._quality

    @property
    def store(self):
        if self._store is None:
            with self._lock:
                if self._store is None:
                    import redis
                    from redis.backoff import NoBackoff
                    from redis.retry import Retry

                    from app.contract.cache.store import CacheStore
                    # No retries: a cache that does not answer at once is a miss, and the
                    # store's circuit breaker skips Redis until it is back.
                    client = redis.Redis.from_url(self.config["REDIS_URL"], socket_timeout=1.0,
                                                  socket_connect_timeout=1.0,
                                                  retry=Retry(NoBackoff(), 0))
                    self._store = CacheStore(client, self.config["REDIS_NAMESPACE"],
                                             qdrant_url=self.config["QDRANT_URL"],
                                             qdrant_path=self.config["QDRANT_PATH"])
        return self._store

    @property
    def aredis(self):
        """The probe's own asyncio Redis pool (created on the loop, on first use), so the
        cache's round trips never take connections the budget and rate limiter need: the
        gateway's shared async pool refuses past 100 (Too many connections), and a refused
        budget call fails open. A blocking pool waits briefly for a free connection."""
        if self._aredis is None:
            import redis.asyncio as aioredis

            from app.contract import aredis
            pool = aredis.fast(aioredis.BlockingConnectionPool.from_url(
                self.config["REDIS_URL"], max_connections=CACHE_ASYNC_CONNECTIONS, timeout=1.0,
                socket_timeout=1.0, socket_connect_timeout=1.0))
            self._aredis = aioredis.Redis(connection_pool=pool)
        return self._aredis

    def served_key(self, request_id: str) -> str:
        return Keys(self.config["REDIS_NAMESPACE"]).cache_served(request_id)

    def close(self) -> None:
        if self._aredis is not None:
            import asyncio
            client, self._aredis = self._aredis, None
            try:  # called from the gateway's async stop: close on its loop
                asyncio.get_running_loop().create_task(client.aclose(close_connection_pool=True))
            except RuntimeError:
                pass  # no loop: the process is ending, and its sockets with it
        if self._writer is not None:
            self._writes.put(None)  # after what is queued
            self._writer.join(timeout=10)
            self._writer = None
        if self._store is not None:
            self._store.close()
            self._store.redis.close()


def warm() -> None:
    """Load the embedding encoder (seconds; the first time on a host it exports the model
    to ONNX) so the first request does not wait."""
    try:
        from app.contract.cache.embedding import get_encoder
        get_encoder()
    except Exception:  # noqa: BLE001 - a cold model is loaded on first use instead
        log.exception("embedding model warm-up failed")


def _cacheable(ctx: RequestContext) -> bool:
    return ctx.services is not None and getattr(ctx.services, "cache", None) is not None \
        and is_cacheable_request(ctx.body, ctx.policy)


def _verification(ctx: RequestContext):
    """The request's Verification: the tenant's learned line (read in the worker thread,
    only when a semantic lookup happens, at most every few seconds per tenant)."""
    from app.contract.cache.store import Verification
    policy = ctx.policy
    threshold = float(policy["cache_similarity_threshold"])
    floor = float(policy["cache_verify_floor"])
    bound = float(policy["cache_error_bound"])
    line = ctx.services.cache.quality.line(ctx.tenant["id"], bound, floor, threshold)
    return Verification(line=line, floor=floor,
                        verified_only=bool(policy["cache_verified_only"]),
                        sample=float(policy["cache_verify_sample_pct"]) / 100.0,
                        entry_needed=min_observations(bound))


def _semantic(ctx: RequestContext, store, key, exact: bool):
    """The lookup past the exact entry, in a worker thread: the verifier's candidate the
    request was not served from goes on ``ctx.telemetry["cache_candidate"]``."""
    threshold = float(ctx.policy["cache_similarity_threshold"])
    notes: dict = {}
    hit = store.lookup(key, lambda: embedding(ctx), threshold, exact=exact,
                       verification=_verification(ctx), notes=notes)
    cand = notes.get("candidate")
    if hit is None and cand is not None:
        ctx.telemetry["cache_candidate"] = {"of_request": cand["request_id"],
                                            "similarity": round(cand["similarity"], 5)}
    return hit


def _probe(ctx: RequestContext, store):
    """Runs in a worker thread: key, exact lookup, then (when the bucket holds anything)
    embedding and semantic lookup."""
    ctx.cache_key = key = build_key(ctx.tenant["id"], ctx.policy, ctx.body["model"], ctx.body)
    return _semantic(ctx, store, key, True)


def _short(body: dict) -> bool:
    """Whether the key is cheap enough to build on the event loop (the entity scan costs
    ~10 us a character: a long prompt's goes to a worker thread)."""
    chars = 0
    for m in body.get("messages") or ():
        c = m.get("content")
        chars += len(c) if isinstance(c, str) else INLINE_KEY_CHARS
        if chars > INLINE_KEY_CHARS:
            return False
    return True


async def _probe_async(ctx: RequestContext, store):
    """The probe without a thread hop where it can: a short request's key is built here and
    the exact entry and the bucket's existence come from the async Redis client in one round
    trip; only a bucket that exists (something to compare by meaning) goes to a worker
    thread. Any failure, or an open breaker, takes the thread path (with its Qdrant
    fallback)."""
    if not (_short(ctx.body) and store.redis_available()):
        return await anyio.to_thread.run_sync(_probe, ctx, store)
    ctx.cache_key = key = build_key(ctx.tenant["id"], ctx.policy, ctx.body["model"], ctx.body)
    try:
        hit, bucket_exists = await store.alookup_exact(ctx.services.cache.aredis, key)
    except Exception as exc:  # noqa: BLE001 - the sync path decides (breaker, Qdrant)
        log.debug("request %s: async exact lookup failed: %s", ctx.request_id, exc)
        return await anyio.to_thread.run_sync(_probe, ctx, store)
    if hit is not None or not bucket_exists or not key.semantic:
        return hit
    return await anyio.to_thread.run_sync(_semantic, ctx, store, key, False)


def _served(response: dict, request_id: str) -> dict:
    return {**response, "id": f"chatcmpl-{request_id}"}


async def run(ctx: RequestContext) -> str:
    ctx.cache = "miss"
    if not _cacheable(ctx):
        ctx.telemetry["cache_bypass"] = True
        return "S01_CASCADE_ROUTE"
    cache = ctx.services.cache
    ctx.collect_stream = True
    hit = await _probe_async(ctx, cache.store)
    # whether the probe needed the vector (False: exact hit, or nothing in the bucket)
    ctx.telemetry["cache_probe_embedded"] = ctx.embedding is not None
    if hit is None:
        return "S01_CASCADE_ROUTE"
    ctx.cache = hit.kind
    ctx.cached_response = _served(hit.response, ctx.request_id)
    ctx.telemetry["cache_hit"] = {"of_request": hit.request_id,
                                  "similarity": round(hit.similarity, 5), "how": hit.how}
    if hit.sampled:  # served now; generated again after the answer (app.gateway.cache_verify)
        ctx.telemetry["cache_hit"].update(sampled=True, tier=hit.tier)
    await ctx.services.release_budget(ctx)  # a hit costs nothing: hold nothing while serving it
    if not cache.store.redis_available():  # a Qdrant hit during an outage: nowhere to note it
        return "RESPOND"
    try:
        await cache.aredis.set(cache.served_key(ctx.request_id), hit.request_id,
                               ex=SERVED_TTL_S)
    except Exception as exc:  # noqa: BLE001 - feedback on this hit then cannot evict it
        log.warning("request %s: could not record the served hit: %s", ctx.request_id, exc)
    await cache.quality.acount_hit(cache.aredis, ctx.tenant["id"],
                                   ctx.workflow_signature or None, hit.how)
    return "RESPOND"


def _store_item(ctx: RequestContext, response: dict, verified: bool = False):
    from app.contract.cache.store import StoreItem
    return StoreItem(ctx.cache_key, ctx.embedding, response, ctx.request_id,
                     int(ctx.policy["cache_ttl_s"]), ctx.workflow_signature or None,
                     vector_later=True, verified=verified, tier=(ctx.tier or {}).get("name", ""))


def exact_answer(body: dict) -> bool:
    """Whether two answers to ``body`` must be equal to agree (temperature 0), rather than
    similar (``app.core.cache_bound.answers_agree``)."""
    return float(body.get("temperature") or 0.0) == 0.0


async def on_complete(ctx: RequestContext, response: dict | None) -> None:
    """After a successful upstream answer (the expanded completion dict, or the assembled
    stream): store it when the request and the answer are cacheable. Runs after the
    answer went out (a background task of the gateway)."""
    if response is None or ctx.cache != "miss" or ctx.cache_key is None or ctx.status != 200:
        return
    if not is_cacheable_response(response, schema_valid=ctx.telemetry.get("schema_valid")):
        return
    if not ctx.services.cache.write_later(ctx, response):
        log.warning("request %s: cache write queue full; answer not cached", ctx.request_id)


async def verify_for_feedback(services: GatewayServices, request_id: str) -> bool:
    """Feedback "pass" on ``request_id``: a validator passed the answer, so the entry it
    was served from (a hit) or the entry it became (a miss that was stored) is verified and
    may serve paraphrases. False when there is no such entry (yet)."""
    cache = getattr(services, "cache", None)
    if cache is None:
        return False
    source = None
    try:
        source = await services.redis.get(cache.served_key(request_id))
    except Exception as exc:  # noqa: BLE001
        log.warning("feedback: served-hit lookup failed: %s", exc)
    target = source.decode() if isinstance(source, bytes) else (source or request_id)
    return await anyio.to_thread.run_sync(lambda: cache.store.mark(target, verified=True))


async def evict_for_feedback(services: GatewayServices, request_id: str) -> bool:
    """Feedback "fail" on ``request_id``: drop the entry it was served from (a hit) or
    the entry its own answer became (a miss that was stored)."""
    cache = getattr(services, "cache", None)
    if cache is None:
        return False
    source = None
    try:
        source = await services.redis.get(cache.served_key(request_id))
    except Exception as exc:  # noqa: BLE001
        log.warning("feedback: served-hit lookup failed: %s", exc)
    target = source.decode() if isinstance(source, bytes) else (source or request_id)
    cache.refuse(target)  # its write may still be queued here
    return await anyio.to_thread.run_sync(cache.store.evict, target)
