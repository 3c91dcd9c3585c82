"""The response cache through the running gateway: exact and semantic hits served at
cost 0 (SDK, streamed and not), tenants isolated, feedback "fail" evicts."""
from __future__ import annotations

from decimal import Decimal

import httpx

from app.extensions import db
from tests.gateway.conftest import make_world, publish_and_wait, wait_for

SYSTEM = {"role": "system", "content": "You answer geography questions."}
ASK = [SYSTEM, {"role": "user", "content": "What is the capital city of France?"}]
REWORDED = [SYSTEM, {"role": "user", "content": "What's the capital city of France?"}]


def _stored(redis_client, ns: str, tenant_id: int, n: int = 1) -> None:
    wait_for(lambda: redis_client.scard(f"{ns}:cache:t:{tenant_id}") >= n, what="cache store")


def _upstream_requests(replicas) -> int:
    return sum(httpx.get(r.url + "/stats").json()["requests"] for r in replicas)


def _stream_text(client, messages, **kw):
    chunks = list(client.chat.completions.create(model="tier-1", messages=messages, stream=True,
                                                 temperature=0, **kw))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return chunks, text


def test_exact_hit_served_streamed_and_not_at_cost_zero(app, world, fake_replicas,
                                                        redis_client):
    ns = app.config["REDIS_NAMESPACE"]
    client = world.client()
    first = client.chat.completions.with_raw_response.create(model="tier-1", messages=ASK,
                                                             temperature=0)
    assert first.headers["x-sluice-cache"] == "miss"
    answer = first.parse().choices[0].message.content
    _stored(redis_client, ns, world.tenant.id)
    before = _upstream_requests(fake_replicas)

    raw = client.chat.completions.with_raw_response.create(model="tier-1", messages=ASK,
                                                           temperature=0)
    hit = raw.parse()
    assert raw.headers["x-sluice-cache"] == "exact"
    assert Decimal(raw.headers["x-sluice-cost-usd"]) == 0
    assert hit.choices[0].message.content == answer
    assert hit.id == "chatcmpl-" + raw.headers["x-sluice-request-id"]

    chunks, text = _stream_text(client, ASK, stream_options={"include_usage": True})
    assert text == answer
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == \
        hit.usage.completion_tokens
    _, text = _stream_text(client, ASK)  # without include_usage: no usage chunk
    assert text == answer
    assert _upstream_requests(fake_replicas) == before  # no hit reached an upstream

    rows = world.drain_rows(4)
    assert [r.cache for r in rows] == ["miss", "exact", "exact", "exact"]
    assert rows[0].cost_usd > 0 and all(r.cost_usd == 0 for r in rows[1:])
    assert all(r.baseline_cost_usd > 0 for r in rows)
    hit_payload = rows[1].payload
    assert hit_payload["caching_and_routing_decision"]["cache_decision"] == "exact"
    assert hit_payload["pipeline"]["cache_hit"]["of_request"] == rows[0].request_id


def test_streamed_miss_is_stored_and_semantic_hit(app, gateway, fake_replicas, frontier,
                                                  redis_client):
    ns = app.config["REDIS_NAMESPACE"]
    # verified_only off: any complete answer serves its paraphrases at once (the cache
    # before issue 22; the verified path is tests/gateway/test_verified_cache.py)
    w = make_world(app, gateway, [s.url for s in fake_replicas], frontier.url,
                   policy={"cache_similarity_threshold": 0.95, "cache_verified_only": False})
    client = w.client()
    _, answer = _stream_text(client, ASK)
    _stored(redis_client, ns, w.tenant.id)
    raw = client.chat.completions.with_raw_response.create(model="tier-1", messages=REWORDED,
                                                           temperature=0)
    assert raw.headers["x-sluice-cache"] == "semantic"
    # the fake upstream would have echoed the reworded question; this is the cached answer
    assert raw.parse().choices[0].message.content == answer
    rows = w.drain_rows(2)
    assert rows[1].cache == "semantic" and rows[1].cost_usd == 0
    decision = rows[1].payload["caching_and_routing_decision"]
    assert decision["semantic_cache_hit"] is True
    assert rows[1].payload["pipeline"]["cache_hit"]["similarity"] >= 0.95
    # a high temperature is not cacheable: no lookup, no hit
    r = client.chat.completions.with_raw_response.create(model="tier-1", messages=ASK,
                                                         temperature=1.0)
    assert r.headers["x-sluice-cache"] == "miss"


def test_tenant_never_sees_another_tenants_answer(app, world, gateway, redis_client):
    ns = app.config["REDIS_NAMESPACE"]
    a = world
    a.client().chat.completions.create(model="tier-1", messages=ASK, temperature=0)
    _stored(redis_client, ns, a.tenant.id)
    from tests.factories import TenantFactory, make_key
    b_tenant = TenantFactory()
    _, b_key = make_key(b_tenant)
    db.session.commit()
    publish_and_wait(gateway)
    b = a.client(api_key=b_key)
    raw = b.chat.completions.with_raw_response.create(model="tier-1", messages=ASK,
                                                      temperature=0)
    assert raw.headers["x-sluice-cache"] == "miss"
    _stored(redis_client, ns, b_tenant.id)
    raw = b.chat.completions.with_raw_response.create(model="tier-1", messages=ASK,
                                                      temperature=0)
    assert raw.headers["x-sluice-cache"] == "exact"  # b's own entry, once b stored it


def test_feedback_fail_on_a_served_hit_evicts_it(app, world, redis_client):
    ns = app.config["REDIS_NAMESPACE"]
    client = world.client()
    client.chat.completions.create(model="tier-1", messages=ASK, temperature=0)
    _stored(redis_client, ns, world.tenant.id)
    raw = client.chat.completions.with_raw_response.create(model="tier-1", messages=ASK,
                                                           temperature=0)
    assert raw.headers["x-sluice-cache"] == "exact"
    world.wait_ledger(2)  # feedback needs the request on record
    r = httpx.post(world.base_url + "/feedback", headers={"authorization": f"Bearer {world.key}"},
                   json={"request_id": raw.headers["x-sluice-request-id"], "verdict": "fail"})
    assert r.status_code == 202 and r.json()["cache_evicted"] is True
    again = client.chat.completions.with_raw_response.create(model="tier-1", messages=ASK,
                                                             temperature=0)
    assert again.headers["x-sluice-cache"] == "miss"
