"""CD-28A cache-poisoning drill: store each pair's ``a``, probe with ``b``, count hits."""
from __future__ import annotations

import json
import uuid
from typing import Any, Iterable

from app.contract.cache.embedding import embed_many
from app.contract.cache.keys import build_key
from app.contract.keys import Keys
from app.contract.cache.store import CacheStore, Verification
from app.contract.policy import DEFAULTS


class PairError(ValueError):
    pass


def read_pairs(lines: Iterable[str]) -> list[dict]:
    """Parse JSONL ``{"a","b","same","kind"}`` lines; blank lines are skipped."""
    pairs = []
    for n, line in enumerate(lines, 1):
        line = line.strip()
        if not line:
            continue
        try:
            d = json.loads(line)
        except json.JSONDecodeError as exc:
            raise PairError(f"line {n}: not JSON ({exc.msg})") from None
        if not isinstance(d, dict) or not isinstance(d.get("a"), str) or not isinstance(d.get("b"), str) \
                or not isinstance(d.get("same"), bool):
            raise PairError(f'line {n}: needs "a" and "b" (text) and "same" (true/false)')
        pairs.append({"a": d["a"], "b": d["b"], "same": d["same"], "kind": str(d.get("kind") or "other")})
    return pairs


def _body(text: str) -> dict:
    return {"model": "auto", "temperature": 0, "messages": [{"role": "user", "content": text}]}


def run_cache_poisoning(pairs: list[dict], redis_client: Any, namespace: str,
                        threshold: float | None = None, *, verified: bool = True) -> dict:
    """Each pair gets its own throwaway tenant under a throwaway namespace (deleted after),
    so ``b`` can only hit its own ``a``. Uses the production CacheStore and key builder.

    ``verified`` (the default): the verified cache at its most permissive, every ``a``
    verified and each tenant's line already down at the policy's floor (what a tenant
    whose evidence has opened the line serves: the verifier alone decides a rewording);
    False: the word-for-word guard at ``threshold`` only (the cache before issue 22)."""
    threshold = DEFAULTS["cache_similarity_threshold"] if threshold is None else float(threshold)
    floor = float(DEFAULTS["cache_verify_floor"])
    verification = Verification(line=floor, floor=floor) if verified else None
    run_ns = Keys(namespace).drill_namespace(uuid.uuid4().hex[:12])
    store = CacheStore(redis_client, run_ns)  # Redis only: never touches the real index
    policy = dict(DEFAULTS)
    vec_a = embed_many([p["a"] for p in pairs])
    vec_b = embed_many([p["b"] for p in pairs])
    by_kind: dict[str, dict] = {}
    false_hits = true_hits = same_n = diff_n = 0
    try:
        for i, p in enumerate(pairs):
            tenant = f"drill-{i}"
            key_a = build_key(tenant, policy, "auto", _body(p["a"]))
            answer = {"id": f"drill-{i}", "object": "chat.completion", "choices": [
                {"index": 0, "finish_reason": "stop",
                 "message": {"role": "assistant", "content": f"answer to pair {i}"}}]}
            store.store(key_a, vec_a[i], answer, f"drill-{i}", ttl_s=600, verified=True)
            hit = store.lookup(build_key(tenant, policy, "auto", _body(p["b"])), vec_b[i],
                               threshold, verification=verification)
            k = by_kind.setdefault(p["kind"], {"pairs": 0, "hits": 0, "false_hits": 0, "true_hits": 0})
            k["pairs"] += 1
            same_n += p["same"]
            diff_n += not p["same"]
            if hit is not None:
                k["hits"] += 1
                if p["same"]:
                    true_hits += 1
                    k["true_hits"] += 1
                else:
                    false_hits += 1
                    k["false_hits"] += 1
    finally:
        keys = list(redis_client.scan_iter(match=f"{run_ns}:*", count=1000))
        for j in range(0, len(keys), 500):
            redis_client.delete(*keys[j:j + 500])
    for k in by_kind.values():
        k["hit_rate"] = round(k["hits"] / k["pairs"], 4) if k["pairs"] else 0.0
    return {"pairs": len(pairs), "false_hits": false_hits,
            "false_hit_rate": round(false_hits / diff_n, 4) if diff_n else 0.0,
            "true_hits": true_hits,
            "true_hit_rate": round(true_hits / same_n, 4) if same_n else 0.0,
            "by_kind": dict(sorted(by_kind.items()))}


def drill_passed(result: dict) -> bool:
    return result["false_hits"] == 0
