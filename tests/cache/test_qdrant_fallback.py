"""The Qdrant copy answers while Redis is down with a filtered search: tenant, composite key
and expiry are conditions of the vector search itself, so expired (or foreign) points that
score higher never push the live answer out of the candidates."""
from __future__ import annotations

import time

import numpy as np
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from app.contract.cache.keys import build_key
from app.contract.cache.store import CacheStore
from app.contract.policy import DEFAULTS

TH = DEFAULTS["cache_similarity_threshold"]


def answer(text: str) -> dict:
    return {"choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": text}}]}


def unit(v: np.ndarray) -> np.ndarray:
    return (v / np.linalg.norm(v)).astype(np.float32)


def test_expired_points_that_score_higher_do_not_hide_the_live_one(tmp_path, closed_port,
                                                                     redis_namespace):
    down = redis.Redis(port=closed_port, socket_timeout=0.2, socket_connect_timeout=0.2,
                       retry=Retry(NoBackoff(), 0))
    store = CacheStore(down, f"{redis_namespace}:q", qdrant_path=str(tmp_path / "qdrant"),
                       breaker_s=60)
    try:
        body = {"model": "auto", "temperature": 0,
                "messages": [{"role": "user", "content": "What is the capital city of France?"}]}
        key = build_key("t1", DEFAULTS, "auto", body)
        rng = np.random.default_rng(7)
        query = unit(rng.standard_normal(384))
        for i in range(10):  # exact matches of the query, about to expire
            store.store(key, query, answer(f"stale {i}"), f"stale-{i}", 1)
        live = unit(query + 0.02 * unit(rng.standard_normal(384)))
        assert float(live @ query) >= TH
        deadline = time.time() + 1.2
        while time.time() < deadline:
            time.sleep(0.1)
        store.store(key, live, answer("fresh"), "fresh", 600)
        other = build_key("t2", DEFAULTS, "auto", body)  # another tenant: never its answer
        assert store.lookup(other, query, TH) is None

        hit = store.lookup(key, query, TH)
        assert hit is not None and hit.request_id == "fresh"
        assert hit.response["choices"][0]["message"]["content"] == "fresh"
    finally:
        store.close()
