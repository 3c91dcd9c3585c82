"""Exact + semantic cache against real Redis and an embedded Qdrant."""
import time

import numpy as np
import pytest
import redis

from app.contract.cache.embedding import embed, fits_window, question_text, semantic_text
from app.contract.cache.keys import build_key, is_cacheable_request, is_cacheable_response
from app.contract.cache.store import CacheStore
from app.contract.policy import DEFAULTS

POLICY = dict(DEFAULTS)
TH = DEFAULTS["cache_similarity_threshold"]


def body(text, **kw):
    return {"model": "auto", "temperature": 0, "messages": [{"role": "user", "content": text}], **kw}


def answer(text="cached answer"):
    return {"id": "chatcmpl-x", "object": "chat.completion", "model": "tier-1",
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": text}}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}}


def put(store, tenant, text, rid="req-1", ttl=60, workflow=None, **kw):
    key = build_key(tenant, POLICY, "auto", body(text, **kw))
    store.store(key, embed(key.text), answer(f"answer to {text}"), rid, ttl, workflow)
    return key


def probe(store, tenant, text, **kw):
    key = build_key(tenant, POLICY, "auto", body(text, **kw))
    return store.lookup(key, embed(key.text), TH)


def test_exact_hit_then_semantic_hit_on_a_light_paraphrase(store):
    put(store, "t1", "What is the warranty policy for SKU-1071 in Florida?")
    hit = probe(store, "t1", "What is the warranty policy for SKU-1071 in Florida?")
    assert hit.kind == "exact" and hit.request_id == "req-1"
    assert hit.response["choices"][0]["message"]["content"].startswith("answer to")
    hit = probe(store, "t1", "Hi, what is the warranty policy for SKU-1071 in Florida? Thanks.")
    assert hit is not None and hit.kind == "semantic" and hit.similarity >= TH


def test_entity_change_never_hits(store):
    put(store, "t1", "What is the warranty policy for SKU-1071 in Florida?")
    assert probe(store, "t1", "What is the warranty policy for SKU-1079 in Florida?") is None
    assert probe(store, "t1", "What is the warranty policy for SKU-1071 in Oregon?") is None


def test_tenant_a_answer_never_served_to_tenant_b(store):
    put(store, "tenant-a", "Summarize the support ticket T40933 for Hooli.")
    assert probe(store, "tenant-b", "Summarize the support ticket T40933 for Hooli.") is None
    assert probe(store, "tenant-b", "summarize the support ticket t40933 for hooli.") is None
    assert probe(store, "tenant-a", "Summarize the support ticket T40933 for Hooli.") is not None


def test_changed_schema_version_never_hits(store):
    q = "Extract the invoice total for ORD-1234"
    schema_v1 = {"type": "json_schema", "json_schema": {"name": "inv", "schema": {"type": "object"}}}
    schema_v2 = {"type": "json_schema", "json_schema": {"name": "inv", "schema": {
        "type": "object", "properties": {"total": {"type": "number"}}}}}
    put(store, "t1", q, response_format=schema_v1)
    assert probe(store, "t1", q, response_format=schema_v2) is None
    assert probe(store, "t1", q) is None
    assert probe(store, "t1", q, response_format=schema_v1).kind == "exact"


def test_sampling_params_and_policy_are_part_of_the_key(store):
    q = "List three uses of Redis streams"
    put(store, "t1", q)
    assert probe(store, "t1", q, max_tokens=5) is None
    # a policy field that shapes the answer misses; one that only routes keeps the entry
    capped = build_key("t1", {**POLICY, "max_tokens_cap": 64}, "auto", body(q))
    assert store.lookup(capped, embed(capped.text), TH) is None
    retuned = build_key("t1", {**POLICY, "router_tau_1": 0.9, "explore_pct": 0.0}, "auto", body(q))
    assert store.lookup(retuned, embed(retuned.text), TH).kind == "exact"


def test_multi_turn_key_covers_the_conversation(store):
    def conv(first_answer):
        return {"model": "auto", "temperature": 0, "messages": [
            {"role": "user", "content": "Which plan includes SSO?"},
            {"role": "assistant", "content": first_answer},
            {"role": "user", "content": "How much does it cost?"}]}
    k1 = build_key("t1", POLICY, "auto", conv("The Enterprise plan."))
    store.store(k1, embed(k1.text), answer("$40 a seat"), "req-conv", 60)
    k2 = build_key("t1", POLICY, "auto", conv("The Team plan."))
    assert k1.exact_hash != k2.exact_hash and k1.composite != k2.composite
    assert store.lookup(k2, embed(k2.text), TH) is None
    single = build_key("t1", POLICY, "auto", body("How much does it cost?"))
    assert store.lookup(single, embed(single.text), TH) is None
    assert store.lookup(k1, embed(k1.text), TH).kind == "exact"


def test_ttl_expiry(store):
    q = "What is our uptime SLA for tier-2?"
    key = build_key("t1", POLICY, "auto", body(q))
    near = build_key("t1", POLICY, "auto", body("Hi, " + q))
    vec, near_vec = embed(key.text), embed(near.text)
    store.store(key, vec, answer(), "req-ttl", 2)
    assert store.lookup(key, vec, TH) is not None
    deadline = time.time() + 10
    while time.time() < deadline and store.lookup(key, vec, TH) is not None:
        time.sleep(0.25)
    assert store.lookup(key, vec, TH) is None
    assert store.lookup(near, near_vec, TH) is None


def test_feedback_eviction(store):
    put(store, "t1", "Is the refund window for ORD-824833 longer than 85 days?", rid="req-bad")
    hit = probe(store, "t1", "Is the refund window for ORD-824833 longer than 85 days? Thanks.")
    assert hit.request_id == "req-bad"
    assert store.evict("req-bad") is True
    assert probe(store, "t1", "Is the refund window for ORD-824833 longer than 85 days?") is None
    assert probe(store, "t1", "Is the refund window for ORD-824833 longer than 85 days? Thanks.") is None
    assert store.evict("req-bad") is False


def test_invalidate_by_tenant_workflow_and_all(store):
    put(store, "t1", "Warranty for SKU-1 in Ohio", rid="a", workflow="support")
    put(store, "t1", "Warranty for SKU-2 in Ohio", rid="b", workflow="billing")
    put(store, "t2", "Warranty for SKU-3 in Ohio", rid="c", workflow="support")
    assert store.invalidate(tenant_id="t1", workflow="support") == 1
    assert probe(store, "t1", "Warranty for SKU-1 in Ohio") is None
    assert probe(store, "t1", "Warranty for SKU-2 in Ohio") is not None
    assert probe(store, "t2", "Warranty for SKU-3 in Ohio") is not None
    store.invalidate(tenant_id="t1")
    assert probe(store, "t1", "Warranty for SKU-2 in Ohio") is None
    assert probe(store, "t2", "Warranty for SKU-3 in Ohio") is not None
    store.invalidate()
    assert probe(store, "t2", "Warranty for SKU-3 in Ohio") is None


def test_redis_outage_degrades_to_a_miss(closed_port, tmp_path):
    dead = redis.Redis(host="127.0.0.1", port=closed_port, socket_connect_timeout=0.2,
                       socket_timeout=0.2)
    s = CacheStore(dead, "outage", qdrant_path="")
    key = build_key("t1", POLICY, "auto", body("anything"))
    vec = np.ones(384, dtype=np.float32) / np.sqrt(384)
    assert s.lookup(key, vec, TH) is None
    assert s.store(key, vec, answer(), "r", 60) is False
    assert s.evict("r") is False
    assert s.invalidate(tenant_id="t1") == 0


def test_broken_qdrant_path_degrades_to_redis_only(raw_redis, redis_namespace, tmp_path):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("not a qdrant store")
    s = CacheStore(raw_redis, f"{redis_namespace}:brokenq", qdrant_path=str(not_a_dir / "q"))
    key = put(s, "t1", "Warranty for SKU-9 in Iowa")
    assert s.lookup(key, embed(key.text), TH).kind == "exact"
    s.invalidate()


def test_both_down_is_a_miss(closed_port, tmp_path):
    dead = redis.Redis(host="127.0.0.1", port=closed_port, socket_connect_timeout=0.2)
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    s = CacheStore(dead, "outage", qdrant_path=str(not_a_dir / "q"))
    key = build_key("t1", POLICY, "auto", body("anything"))
    assert s.lookup(key, embed(key.text), TH) is None


def test_qdrant_serves_semantic_hits_while_redis_is_down(raw_redis, redis_namespace, tmp_path,
                                                         closed_port):
    path = str(tmp_path / "q")
    live = CacheStore(raw_redis, f"{redis_namespace}:qd", qdrant_path=path)
    put(live, "t1", "What is the warranty policy for SKU-2461 in Florida?", rid="q1")
    live.close()
    dead = redis.Redis(host="127.0.0.1", port=closed_port, socket_connect_timeout=0.2)
    s = CacheStore(dead, f"{redis_namespace}:qd", qdrant_path=path)
    hit = probe(s, "t1", "What is the warranty policy for SKU-2461 in Florida ?")
    assert hit is not None and hit.kind == "semantic" and hit.request_id == "q1"
    assert probe(s, "t2", "What is the warranty policy for SKU-2461 in Florida ?") is None
    assert probe(s, "t1", "What is the warranty policy for SKU-2462 in Florida ?") is None
    s.close()
    live.invalidate()


def test_cacheable_request_and_response_rules():
    assert is_cacheable_request({"temperature": 0}, POLICY)
    assert not is_cacheable_request({"temperature": 0.7}, POLICY)
    assert not is_cacheable_request({}, POLICY)  # OpenAI's default temperature is 1
    assert is_cacheable_request({"temperature": 0.5}, {**POLICY, "cache_max_temperature": 0.5})
    assert not is_cacheable_request({"temperature": 0}, {**POLICY, "cache_enabled": False})
    assert not is_cacheable_request({"temperature": 0, "n": 2}, POLICY)
    assert is_cacheable_response(answer())
    length = answer()
    length["choices"][0]["finish_reason"] = "length"
    assert is_cacheable_response(length)
    filtered = answer()
    filtered["choices"][0]["finish_reason"] = "content_filter"
    assert not is_cacheable_response(filtered)
    assert not is_cacheable_response(answer(), schema_valid=False)
    assert not is_cacheable_response(answer(), negative_feedback=True)
    assert not is_cacheable_response({"choices": []})


def test_semantic_text_covers_user_and_system_turns():
    msgs = [{"role": "system", "content": "Be  terse."}, {"role": "user", "content": "Hi\n there"},
            {"role": "assistant", "content": "ignored"},
            {"role": "user", "content": [{"type": "text", "text": "parts  too"}]}]
    assert semantic_text(msgs) == "Be terse.\nHi there\nparts too"



def test_question_text_is_the_last_user_turn():
    msgs = [{"role": "system", "content": "Be  terse."}, {"role": "user", "content": "Hi\n there"},
            {"role": "assistant", "content": "ignored"},
            {"role": "user", "content": [{"type": "text", "text": "parts  too"}]}]
    assert question_text(msgs) == "parts too"
    assert question_text([{"role": "system", "content": "Only  a system turn"}]) == \
        "Only a system turn"


LONG_SYSTEM = " ".join(f"Rule {i}: answer support questions politely and cite the handbook "
                       f"section that applies." for i in range(400))  # ~6,000 tokens


def _sys_body(question):
    return {"model": "auto", "temperature": 0, "messages": [
        {"role": "system", "content": LONG_SYSTEM}, {"role": "user", "content": question}]}


def test_different_questions_under_one_long_system_prompt_never_share_an_answer(store):
    """The embedding reads 256 tokens: with the system prompt in front, every question under
    it would embed the same and meet the same entity signature (none)."""
    key = build_key("t1", POLICY, "auto", _sys_body("How do I reset my password?"))
    store.store(key, embed(key.text), answer("Use the reset link."), "req-long", 60)
    other = build_key("t1", POLICY, "auto", _sys_body("How do I update my billing address?"))
    assert other.composite == key.composite  # same bucket: only the vector tells them apart
    assert store.lookup(other, embed(other.text), TH) is None
    near = build_key("t1", POLICY, "auto", _sys_body("How do I reset my password"))
    hit = store.lookup(near, embed(near.text), TH)
    assert hit is not None and hit.kind == "semantic"


def test_a_question_longer_than_the_embedding_window_matches_exactly_or_not_at_all(store):
    long_q = " ".join(["Please summarise the following incident log line by line."]
                      + [f"step {i} the service restarted cleanly" for i in range(120)])
    assert not fits_window(long_q) and fits_window("How do I reset my password?")
    key = build_key("t1", POLICY, "auto", body(long_q + " Finally it recovered."))
    assert not key.semantic
    store.store(key, embed(key.text), answer("summary A"), "req-win", 60)
    tail = build_key("t1", POLICY, "auto", body(long_q + " Finally it crashed."))
    assert store.lookup(tail, embed(tail.text), TH) is None
    assert store.lookup(key, embed(key.text), TH).kind == "exact"
