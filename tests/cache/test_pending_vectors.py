"""Answers stored before anyone embedded them (``vector_later``): the first lookup that
reaches their bucket embeds and indexes them, and they then decide exactly as answers
stored with their vector would: the CD-28A pairs give the same hits either way."""
from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

from app.cache.drill import read_pairs
from app.contract.cache.embedding import embed_many
from app.contract.cache.keys import build_key
from app.contract.cache.store import CacheStore, _unpack
from app.contract.policy import DEFAULTS

POLICY = dict(DEFAULTS)
TH = DEFAULTS["cache_similarity_threshold"]
ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "app" / "cache" / "data" / "cache_pairs_sample.jsonl"
HELDOUT = Path(__file__).resolve().parent / "data" / "pairs_heldout.jsonl"


def body(text: str) -> dict:
    return {"model": "auto", "temperature": 0, "messages": [{"role": "user", "content": text}]}


def answer(text: str) -> dict:
    return {"id": "chatcmpl-x", "object": "chat.completion", "choices": [
        {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}]}


class CountingEncoder:
    """The real encoder, counting the texts it was asked for."""

    def __init__(self) -> None:
        self.texts: list[str] = []

    def __call__(self, texts: list[str]) -> np.ndarray:
        self.texts += texts
        return embed_many(texts)


@pytest.fixture()
def ns(redis_namespace, raw_redis):
    """A namespace of the test's own, emptied afterwards: its entries live 600 s, and
    expiring during a later test they read as that test's changes (the route-table walk
    of tests/security saw them as writes of refused calls)."""
    name = f"{redis_namespace}:p{uuid.uuid4().hex[:8]}"
    yield name
    for key in list(raw_redis.scan_iter(f"{name}:*", count=1000)):
        raw_redis.delete(key)


def _store(raw_redis, ns, **kw) -> CacheStore:
    return CacheStore(raw_redis, ns, **kw)


def _hits(pairs, raw_redis, ns, *, lazy: bool) -> list[bool]:
    store = _store(raw_redis, ns)
    vec_a = embed_many([p["a"] for p in pairs])
    vec_b = embed_many([p["b"] for p in pairs])
    out = []
    try:
        for i, p in enumerate(pairs):
            tenant = f"{'lazy' if lazy else 'eager'}-{i}"
            key_a = build_key(tenant, POLICY, "auto", body(p["a"]))
            store.store(key_a, None if lazy else vec_a[i], answer(f"answer {i}"), f"r{i}", 600,
                        vector_later=lazy)
            key_b = build_key(tenant, POLICY, "auto", body(p["b"]))
            out.append(store.lookup(key_b, lambda i=i: vec_b[i], TH) is not None)
    finally:
        store.invalidate()
    return out


@pytest.mark.parametrize("path", [SAMPLE, HELDOUT], ids=["sample", "heldout"])
def test_drill_pairs_decide_the_same_with_vectors_filled_later(path, raw_redis, ns):
    pairs = read_pairs(path.read_text().splitlines())
    eager = _hits(pairs, raw_redis, ns + ":e", lazy=False)
    lazy = _hits(pairs, raw_redis, ns + ":l", lazy=True)
    assert lazy == eager
    assert not any(h for h, p in zip(lazy, pairs) if not p["same"])  # 0 false hits
    assert sum(lazy) > 0


def test_a_pending_answer_is_embedded_once_by_the_first_lookup_that_needs_it(raw_redis, ns):
    enc = CountingEncoder()
    writer = _store(raw_redis, ns, embed_texts=enc)
    key = build_key("t1", POLICY, "auto", body("What is the capital city of France?"))
    writer.store(key, None, answer("Paris"), "r-paris", 600, vector_later=True)

    # an exact repeat: served without any embedding
    assert writer.lookup(key, lambda: pytest.fail("no vector needed"), TH).kind == "exact"
    assert enc.texts == []

    other = _store(raw_redis, ns, embed_texts=enc)  # another gateway process
    para = build_key("t1", POLICY, "auto", body("What's the capital city of France?"))
    (qvec,) = embed_many([para.text])
    hit = other.lookup(para, lambda: qvec, TH)
    assert hit is not None and hit.kind == "semantic" and hit.request_id == "r-paris"
    assert enc.texts == [key.text]  # the pending entry, embedded once

    third = _store(raw_redis, ns, embed_texts=enc)  # its mirror reads the filled record
    assert third.lookup(para, lambda: qvec, TH).request_id == "r-paris"
    writer.mirror.sync(raw_redis, writer._k("b", key.tenant_id, key.composite),
                       _unpack)
    assert writer.lookup(para, lambda: qvec, TH, exact=False).request_id == "r-paris"
    assert enc.texts == [key.text]  # nobody embedded it again
    # and the Qdrant-free store wrote nothing else: the bucket holds one record
    assert raw_redis.hlen(writer._k("b", key.tenant_id, key.composite)) == 1


def test_an_evicted_pending_answer_is_not_revived_by_a_lookup(raw_redis, ns):
    enc = CountingEncoder()
    store = _store(raw_redis, ns, embed_texts=enc)
    key = build_key("t1", POLICY, "auto", body("What is the capital city of Germany?"))
    store.store(key, None, answer("Use the link."), "r-bad", 600, vector_later=True)
    para = build_key("t1", POLICY, "auto", body("What's the capital city of Germany?"))
    (qvec,) = embed_many([para.text])
    reader = _store(raw_redis, ns, embed_texts=enc)
    assert para.composite == key.composite
    assert reader.mirror.sync(raw_redis, reader._k("b", para.tenant_id, para.composite),
                              _unpack) is not None  # its copy holds the pending entry
    assert store.evict("r-bad")  # feedback "fail" before anyone embedded it
    assert reader.lookup(para, lambda: qvec, TH) is None
    assert enc.texts == []  # gone from Redis: not embedded, not written back
    assert raw_redis.hlen(reader._k("b", para.tenant_id, para.composite)) == 0


def test_an_expired_pending_answer_never_matches(raw_redis, ns):
    store = _store(raw_redis, ns, embed_texts=CountingEncoder())
    key = build_key("t1", POLICY, "auto", body("What is the capital city of Italy?"))
    store.store(key, None, answer("Rome"), "r-rome", 1, vector_later=True)
    para = build_key("t1", POLICY, "auto", body("What's the capital city of Italy?"))
    (qvec,) = embed_many([para.text])
    deadline = time.time() + 1.5
    while time.time() < deadline:
        time.sleep(0.1)
    assert store.lookup(para, lambda: pytest.fail("nothing live: no vector"), TH) is None


def test_without_vector_later_an_unembedded_answer_serves_exact_repeats_only(raw_redis, ns):
    store = _store(raw_redis, ns, embed_texts=CountingEncoder())
    key = build_key("t1", POLICY, "auto", body("What is the capital city of Spain?"))
    store.store(key, None, answer("Madrid"), "r-madrid", 600)
    assert store.lookup(key, None, TH).kind == "exact"
    para = build_key("t1", POLICY, "auto", body("What's the capital city of Spain?"))
    assert store.lookup(para, lambda: pytest.fail("empty bucket: no vector"), TH) is None
    assert json.loads(raw_redis.get(store._k("r", "r-madrid")))["b"]
