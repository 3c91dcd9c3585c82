"""Process-local copies of semantic buckets, kept in step with Redis incrementally.

A bucket (all cached prompts sharing one composite key: tenant, policy, schema version,
model, history, entity signature) can hold thousands of entries: every entity-free question
of one tenant and system prompt lands in the same one. Reading such a bucket from Redis on
every lookup costs ~30 ms at 5,000 entries, so each process keeps the bucket's vectors as one
float32 matrix and asks Redis only what changed:

- ``<bucket>:v``  hash ``g`` (generation: a random token set when the bucket is created, so a
  deleted and re-created bucket never looks like the old one) and ``n`` (last sequence number).
- ``<bucket>:s``  zset request_id -> sequence number (insertion order).

A lookup sends one MULTI (generation, size, entries newer than the copy's ``n``); only new
entries' records travel, then one numpy product scans the whole bucket. Deleted entries are
not pushed to copies: candidates are confirmed against their exact-cache entry before they
are served (an evicted or invalidated entry has none), and a copy much larger than the bucket
is reloaded.

An entry stored without its vector (``app.contract.cache.store``: the answer's bucket was empty
when it was asked, so nobody needed the vector yet) is *pending*: its record carries the text
instead. The first lookup that finds pending entries embeds them, writes the vectors back
(a new sequence number, so every copy picks the filled record up) and the entry becomes
an ordinary row.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Callable

import numpy as np

from app.core.entities import EntityProfile

# Rows per matrix-vector product. Below this OpenBLAS stays on one thread; a threaded gemv
# of a few thousand rows spins for milliseconds on a busy host (measured: 0.6 ms chunked vs
# 2-20 ms in one call for 5,000 x 384 with two contended cores).
SCAN_CHUNK = 1024


class BucketCopy:
    """One bucket's live entries: ids, metadata, an (n, d) float32 matrix and expiries."""

    __slots__ = ("gen", "n", "ids", "metas", "vecs", "exp", "rows", "index", "pending")

    def __init__(self, gen: bytes, n: int) -> None:
        self.gen, self.n = gen, n
        self.ids: list[str] = []
        self.metas: list[dict] = []
        self.vecs = np.empty((0, 0), dtype=np.float32)
        self.exp = np.empty(0, dtype=np.float64)
        self.rows = 0
        self.index: dict[str, int] = {}        # request_id -> row
        self.pending: dict[str, dict] = {}     # request_id -> meta of an entry with no vector yet

    def append(self, entries: list[tuple[str, dict, np.ndarray]]) -> None:
        """New records in sequence order: a vectorless one is pending; one whose request id
        already has a row (its vector written back) replaces that row."""
        fresh = []
        for rid, meta, vec in entries:
            if not len(vec):
                if rid not in self.index:
                    self.pending[rid] = meta
                continue
            self.pending.pop(rid, None)
            row = self.index.get(rid)
            if row is not None and self.vecs.shape[1] == len(vec):
                meta["_profile"] = EntityProfile.from_dict(meta["profile"])
                self.vecs[row], self.exp[row], self.metas[row] = vec, float(meta["exp"]), meta
                continue
            fresh.append((rid, meta, vec))
        self._append_rows(fresh)

    def _append_rows(self, entries: list[tuple[str, dict, np.ndarray]]) -> None:
        if not entries:
            return
        dim = len(entries[0][2])
        need = self.rows + len(entries)
        if need > len(self.vecs) or self.vecs.shape[1] != dim:
            cap = max(need, 2 * len(self.vecs), 16)
            vecs = np.zeros((cap, dim), dtype=np.float32)
            exp = np.zeros(cap, dtype=np.float64)
            if self.rows and self.vecs.shape[1] == dim:
                vecs[:self.rows] = self.vecs[:self.rows]
                exp[:self.rows] = self.exp[:self.rows]
            self.vecs, self.exp = vecs, exp
        for rid, meta, vec in entries:
            if len(vec) != dim:
                continue
            meta["_profile"] = EntityProfile.from_dict(meta["profile"])
            self.vecs[self.rows] = vec
            self.exp[self.rows] = float(meta["exp"])
            self.ids.append(rid)
            self.metas.append(meta)
            self.index[rid] = self.rows
            self.rows += 1

    def candidates(self, query: np.ndarray, threshold: float, now: float,
                   accept: Callable[[EntityProfile], bool]) -> list[tuple[int, float]]:
        """Rows with cosine >= ``threshold`` whose profile ``accept`` takes, best first.

        Reads the row count before the arrays: a concurrent append (another thread's sync)
        writes a row and swaps in grown arrays before it raises the count, so the rows read
        are always whole in the arrays read."""
        rows = self.rows
        vecs, exp, metas = self.vecs, self.exp, self.metas
        if not rows or vecs.shape[1] != len(query):
            return []
        query = np.asarray(query, dtype=np.float32)
        sims = np.empty(rows, dtype=np.float32)
        for i in range(0, rows, SCAN_CHUNK):
            np.dot(vecs[i:min(i + SCAN_CHUNK, rows)], query, out=sims[i:min(i + SCAN_CHUNK, rows)])
        sims[exp[:rows] <= now] = -np.inf
        idx = np.flatnonzero(sims >= threshold)
        idx = idx[np.argsort(-sims[idx], kind="stable")]
        return [(int(i), float(sims[i])) for i in idx if accept(metas[i]["_profile"])]

    def has_live(self, now: float) -> bool:
        """Whether any entry is unexpired (and so could answer a lookup)."""
        rows, exp = self.rows, self.exp
        return bool(rows) and bool((exp[:rows] > now).any()) \
            or any(m["exp"] > now for m in list(self.pending.values()))

    def live_pending(self, now: float, limit: int) -> list[tuple[str, dict]]:
        """Up to ``limit`` unexpired pending entries, newest first; expired ones are dropped."""
        items = list(self.pending.items())
        for rid, meta in items:
            if meta["exp"] <= now:
                self.pending.pop(rid, None)
        return [(r, m) for r, m in reversed(items) if m["exp"] > now][:limit]

    def kill(self, row: int) -> None:
        """Drop a row from consideration (its entry is gone from Redis)."""
        self.exp[row] = 0.0


class BucketMirror:
    """LRU of bucket copies, bounded in rows and buckets; safe across threads."""

    def __init__(self, max_rows: int = 50_000, max_buckets: int = 4096) -> None:
        self.max_rows, self.max_buckets = max_rows, max_buckets
        self._copies: OrderedDict[str, BucketCopy] = OrderedDict()
        self._rows = 0
        self._lock = threading.Lock()

    def clear(self) -> None:
        with self._lock:
            self._copies.clear()
            self._rows = 0

    def sync(self, redis: Any, bucket: str, unpack: Callable) -> BucketCopy | None:
        """The bucket as it is in Redis now (None when it does not exist)."""
        with self._lock:
            copy = self._copies.get(bucket)
            if copy is not None:
                self._copies.move_to_end(bucket)
        if copy is None:
            return self._load(redis, bucket, unpack)
        pipe = redis.pipeline(transaction=True)
        pipe.hmget(f"{bucket}:v", "g", "n")
        pipe.zcard(f"{bucket}:s")
        pipe.zrangebyscore(f"{bucket}:s", f"({copy.n}", "+inf", withscores=True)
        (gen, _n), card, new = pipe.execute()
        if gen is None:
            self._drop(bucket)
            return None
        if gen != copy.gen or copy.rows > 2 * card + 64:
            return self._load(redis, bucket, unpack)
        if new:
            start = copy.n
            rids = [r.decode() if isinstance(r, bytes) else r for r, _ in new]
            records = redis.hmget(bucket, rids)
            entries = [(rid, *unpack(rec)) for rid, rec in zip(rids, records) if rec is not None]
            with self._lock:
                if copy.n == start and self._copies.get(bucket) is copy:
                    before = copy.rows
                    copy.append(entries)
                    copy.n = int(max(score for _, score in new))
                    self._rows += copy.rows - before
                    self._shrink(keep=bucket)
        return copy

    def _load(self, redis: Any, bucket: str, unpack: Callable) -> BucketCopy | None:
        pipe = redis.pipeline(transaction=True)
        pipe.hmget(f"{bucket}:v", "g", "n")
        pipe.hgetall(bucket)
        (gen, n), records = pipe.execute()
        if gen is None:
            self._drop(bucket)
            return None
        copy = BucketCopy(gen, int(n or 0))
        copy.append([(rid.decode() if isinstance(rid, bytes) else rid, *unpack(rec))
                     for rid, rec in records.items()])
        with self._lock:
            old = self._copies.pop(bucket, None)
            self._rows -= old.rows if old is not None else 0
            self._copies[bucket] = copy
            self._rows += copy.rows
            self._shrink(keep=bucket)
        return copy

    def fill(self, bucket: str, copy: BucketCopy,
             entries: list[tuple[str, dict, np.ndarray]]) -> None:
        """Pending entries of ``copy`` got their vectors (written back to Redis too)."""
        with self._lock:
            before = copy.rows
            copy.append(entries)
            if self._copies.get(bucket) is copy:
                self._rows += copy.rows - before
                self._shrink(keep=bucket)

    def forget(self, bucket: str) -> None:
        """The bucket is gone from Redis: drop its copy."""
        self._drop(bucket)

    def _drop(self, bucket: str) -> None:
        with self._lock:
            old = self._copies.pop(bucket, None)
            if old is not None:
                self._rows -= old.rows

    def _shrink(self, keep: str) -> None:
        while len(self._copies) > 1 and (self._rows > self.max_rows
                                         or len(self._copies) > self.max_buckets):
            name, old = next(iter(self._copies.items()))
            if name == keep:
                self._copies.move_to_end(name)
                continue
            del self._copies[name]
            self._rows -= old.rows
