"""A crowded semantic bucket (every entity-free question of a tenant shares one composite
key) still finds its best match; other processes' copies follow adds, evictions and
invalidations. Real Redis; vectors are synthetic so that thousands of entries store fast."""
import itertools
import uuid

import numpy as np
import pytest

from app.contract.cache.keys import build_key
from app.contract.cache.store import CacheStore
from app.contract.policy import DEFAULTS

TH = DEFAULTS["cache_similarity_threshold"]
ADJ = """quick simple short clear formal friendly polite detailed careful gentle brief plain
honest direct calm warm""".split()
NOUN = """summary letter reply note message email answer outline draft review report story
memo poem speech list""".split()


def texts(n):
    """Entity-free prompts (common words only): they all share one composite key."""
    combos = itertools.product(ADJ, NOUN, ADJ)
    return [f"Write a {a} {b} that sounds {c}" for a, b, c in itertools.islice(combos, n)]


def body(text):
    return {"model": "auto", "temperature": 0, "messages": [{"role": "user", "content": text}]}


def unit(rng, dim=384):
    v = rng.standard_normal(dim).astype(np.float32)
    return v / np.linalg.norm(v)


def near(v, rng, eps=0.05):
    w = v + eps * unit(rng, len(v))
    return (w / np.linalg.norm(w)).astype(np.float32)


ANSWER = {"choices": [{"index": 0, "finish_reason": "stop",
                       "message": {"role": "assistant", "content": "ok"}}]}


@pytest.fixture()
def ns(raw_redis, redis_namespace):
    name = f"{redis_namespace}:crowd{uuid.uuid4().hex[:8]}"
    yield name
    keys = list(raw_redis.scan_iter(match=f"{name}:*", count=1000))
    for i in range(0, len(keys), 500):
        raw_redis.delete(*keys[i:i + 500])


def fill(store, n, rng, tenant="t1", first_rid=0):
    vecs = []
    for i, text in enumerate(texts(n)):
        key = build_key(tenant, DEFAULTS, "auto", body(text))
        vecs.append(unit(rng))
        store.store(key, vecs[-1], {**ANSWER, "n": i}, f"r{first_rid + i}", 600)
    return vecs


def probe(store, i, vec, tenant="t1"):
    """A light paraphrase (a filler word) of prompt ``i``: exact misses, semantic may hit."""
    key = build_key(tenant, DEFAULTS, "auto", body("Please " + texts(i + 1)[i].lower()))
    return store.lookup(key, vec, TH)


def test_all_entity_free_prompts_share_one_bucket():
    keys = [build_key("t1", DEFAULTS, "auto", body(t)) for t in texts(50)]
    assert len({k.composite for k in keys}) == 1 and len({k.exact_hash for k in keys}) == 50


def test_the_oldest_of_a_thousand_is_still_found(raw_redis, ns):
    rng = np.random.default_rng(1)
    store = CacheStore(raw_redis, ns)
    vecs = fill(store, 1000, rng)
    for i in (0, 1, 500, 999):
        hit = probe(store, i, near(vecs[i], rng))
        assert hit is not None and hit.kind == "semantic" and hit.request_id == f"r{i}", i
    # A fresh process (no copy yet) finds the same best match.
    other = CacheStore(raw_redis, ns)
    assert probe(other, 0, near(vecs[0], rng)).request_id == "r0"
    assert probe(other, 0, unit(rng)) is None  # nothing near a random direction


def test_copies_follow_adds_evictions_and_invalidation(raw_redis, ns):
    rng = np.random.default_rng(2)
    a, b = CacheStore(raw_redis, ns), CacheStore(raw_redis, ns)  # two gateway processes
    vecs = fill(a, 100, rng)
    assert probe(a, 5, near(vecs[5], rng)).request_id == "r5"  # a now holds a copy
    new_text = texts(101)[100]
    new_vec = unit(rng)
    b.store(build_key("t1", DEFAULTS, "auto", body(new_text)), new_vec, ANSWER, "r-new", 600)
    assert probe(a, 100, near(new_vec, rng)).request_id == "r-new"  # incremental fetch
    assert b.evict("r5") is True
    assert probe(a, 5, near(vecs[5], rng)) is None  # a's copy still has r5: it must not serve it
    b.invalidate(tenant_id="t1")
    # Re-created bucket, a different answer for the same prompt and vector.
    key = build_key("t1", DEFAULTS, "auto", body(texts(8)[7]))
    b.store(key, vecs[7], ANSWER, "r-after", 600)
    assert probe(a, 7, near(vecs[7], rng)).request_id == "r-after"
    assert probe(a, 6, near(vecs[6], rng)) is None


def test_cap_drops_the_oldest_and_expired_entries_are_swept(raw_redis, ns):
    rng = np.random.default_rng(3)
    store = CacheStore(raw_redis, ns, bucket_cap=50)
    vecs = fill(store, 60, rng)
    bucket = store._k("b", "t1", build_key("t1", DEFAULTS, "auto", body(texts(1)[0])).composite)
    assert raw_redis.zcard(f"{bucket}:s") == 50 and raw_redis.hlen(bucket) == 50
    assert probe(CacheStore(raw_redis, ns), 0, near(vecs[0], rng)) is None
    assert probe(store, 59, near(vecs[59], rng)).request_id == "r59"
    # Entries past their TTL leave the bucket when the next entry is stored.
    raw_redis.zadd(f"{bucket}:e", {f"r{i}": 1.0 for i in range(10, 20)})
    store.store(build_key("t1", DEFAULTS, "auto", body("Write a note")), unit(rng), ANSWER, "r-x", 600)
    assert raw_redis.zcard(f"{bucket}:s") == 41
    assert not any(raw_redis.hexists(bucket, f"r{i}") for i in range(10, 20))
