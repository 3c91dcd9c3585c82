"""The verified cache's evidence and counters in Redis (issue 22), shared by the gateway
(writes) and the console (reads).

- ``<ns>:cache:ev:<tenant>``  hash of the tenant's observations per cosine bin
  (``n<i>``, ``w<i>``: ``app.core.cache_bound.Evidence``), from which its line is learned.
- ``<ns>:cache:qs:<tenant>:<workflow>``  hash of counters per tenant and workflow (``-`` for
  none): hits by how they were judged (``hits_exact``, ``hits_fast``, ``hits_verified``),
  ``sampled`` / ``sampled_wrong`` (verifier hits served and generated again upstream in
  the background, as a check: ``app.gateway.cache_verify``), ``checked`` /
  ``checked_wrong`` (misses whose fresh answer was compared with an unserved candidate),
  ``verified`` (entries that became verified), ``evicted`` (entries a disagreement
  evicted), ``verify_cost_usd_micros`` (what sampling cost), and the same ``n<i>``/``w<i>``
  bins, so the console shows the measured error per workflow.

Every counter lives 30 days from its last write. Nothing here raises: a counter that
cannot be written is lost, never an error on the data path.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any

from app.contract.keys import Keys
from app.core.cache_bound import Evidence, bin_of

log = logging.getLogger(__name__)
STATS_TTL_S = 30 * 86400
LINE_TTL_S = 5.0     # how long a process reuses a tenant's line before reading it again
HIT_FIELDS = {"exact": "hits_exact", "fast": "hits_fast", "verified": "hits_verified"}


class CacheQuality:
    def __init__(self, redis: Any, namespace: str) -> None:
        self.redis = redis
        self.keys = Keys(namespace)
        self._lines: dict[str, tuple[float, Evidence]] = {}
        self._lock = threading.Lock()

    def evidence_key(self, tenant: Any) -> str:
        return self.keys.cache("ev", tenant)

    def stats_key(self, tenant: Any, workflow: str | None) -> str:
        return self.keys.cache("qs", tenant, workflow or "-")

    # ---- the line ---------------------------------------------------------------------
    def evidence(self, tenant: Any) -> Evidence:
        """The tenant's observations, read at most every LINE_TTL_S per process."""
        now = time.monotonic()
        t = str(tenant)
        with self._lock:
            known = self._lines.get(t)
        if known is not None and now - known[0] < LINE_TTL_S:
            return known[1]
        try:
            raw = self.redis.hgetall(self.evidence_key(t))
            ev = Evidence.from_fields({(k.decode() if isinstance(k, bytes) else k): v
                                       for k, v in raw.items()})
        except Exception:  # noqa: BLE001 - no evidence: the verified path stays closed
            log.debug("cache evidence unreadable", exc_info=True)
            ev = Evidence()
        with self._lock:
            self._lines[t] = (now, ev)
        return ev

    def line(self, tenant: Any, bound: float, floor: float, fast_line: float) -> float:
        return self.evidence(tenant).line(bound, floor, fast_line)

    # ---- writes -----------------------------------------------------------------------
    def observe(self, tenant: Any, workflow: str | None, similarity: float, agreed: bool,
                source: str, cost_usd_micros: int = 0) -> None:
        """One comparison of a cached answer with a fresh one (``source``: "sample", a
        served hit generated again off the path; "check", a miss compared with an unserved
        candidate). ``cost_usd_micros``: what generating it again cost (a sample's)."""
        i = bin_of(similarity)
        prefix = "sampled" if source == "sample" else "checked"
        try:
            pipe = self.redis.pipeline(transaction=False)
            for key in (self.evidence_key(tenant), self.stats_key(tenant, workflow)):
                if i >= 0:
                    pipe.hincrby(key, f"n{i}", 1)
                    if not agreed:
                        pipe.hincrby(key, f"w{i}", 1)
                pipe.expire(key, STATS_TTL_S)
            skey = self.stats_key(tenant, workflow)
            pipe.hincrby(skey, prefix, 1)
            if not agreed:
                pipe.hincrby(skey, f"{prefix}_wrong", 1)
            if cost_usd_micros:
                pipe.hincrby(skey, "verify_cost_usd_micros", int(cost_usd_micros))
            pipe.execute()
        except Exception:  # noqa: BLE001
            log.warning("cache evidence not recorded", exc_info=True)
        with self._lock:
            self._lines.pop(str(tenant), None)

    def count(self, tenant: Any, workflow: str | None, field: str, n: int = 1) -> None:
        try:
            key = self.stats_key(tenant, workflow)
            pipe = self.redis.pipeline(transaction=False)
            pipe.hincrby(key, field, n)
            pipe.expire(key, STATS_TTL_S)
            pipe.execute()
        except Exception:  # noqa: BLE001
            log.debug("cache counter %s not recorded", field, exc_info=True)

    async def acount_hit(self, aredis: Any, tenant: Any, workflow: str | None, how: str) -> None:
        """A served hit, from the event loop (hits only: a miss writes nothing here)."""
        key = self.stats_key(tenant, workflow)
        try:
            async with aredis.pipeline(transaction=False) as pipe:
                pipe.hincrby(key, HIT_FIELDS.get(how, "hits_fast"), 1)
                pipe.expire(key, STATS_TTL_S)
                await pipe.execute()
        except Exception:  # noqa: BLE001
            log.debug("cache hit counter not recorded", exc_info=True)

    # ---- reads (console) -----------------------------------------------------------------
    def rows(self, tenant: Any = None) -> list[dict]:
        """Every (tenant, workflow)'s counters: [{tenant, workflow, fields...}]."""
        pattern = self.keys.cache("qs", "*" if tenant is None else tenant, "*")
        out = []
        for key in self.redis.scan_iter(match=pattern, count=500):
            key = key.decode() if isinstance(key, bytes) else key
            parts = key.split(":")
            raw = self.redis.hgetall(key)
            fields = {(k.decode() if isinstance(k, bytes) else k): int(v) for k, v in raw.items()}
            out.append({"tenant": parts[-2], "workflow": "" if parts[-1] == "-" else parts[-1],
                        **fields})
        return sorted(out, key=lambda r: (r["tenant"], r["workflow"]))
