"""The official openai SDK against a running gateway and real upstream servers."""
from __future__ import annotations

from decimal import Decimal

import httpx
import openai
import orjson
import pytest

from tests.gateway.conftest import FRONTIER_KEY

MSGS = [{"role": "system", "content": "You extract invoices. Today is 2026-12-02."},
        {"role": "user", "content": "hello there world"}]


def test_non_streaming_completion(world):
    client = world.client()
    raw = client.chat.completions.with_raw_response.create(model="tier-1", messages=MSGS)
    resp = raw.parse()
    assert resp.choices[0].message.content == "Echo: hello there world"
    assert resp.usage.prompt_tokens == 9 and resp.usage.completion_tokens == 4
    assert raw.headers["x-sluice-tier"] == "tier-1"
    assert raw.headers["x-sluice-cache"] == "miss"
    assert raw.headers["x-sluice-request-id"].startswith("req_")
    # 9 in (none cached on first sight), 4 out at tier-1 prices
    cost = (9 * Decimal("0.06") + 4 * Decimal("0.18")) / 1_000_000
    assert Decimal(raw.headers["x-sluice-cost-usd"]) == cost


def test_streaming_matches_non_streaming_and_reports_usage(world):
    client = world.client()
    full = client.chat.completions.create(model="tier-1", messages=MSGS).choices[0].message.content
    stream = client.chat.completions.create(model="tier-1", messages=MSGS, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 4
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens > 0  # the replica saw the prefix


def test_sse_framing_is_openai_exact(world):
    for include in (True, False):
        body = {"model": "tier-1", "messages": MSGS, "stream": True}
        if include:
            body["stream_options"] = {"include_usage": True}
        with httpx.stream("POST", world.base_url + "/chat/completions", json=body,
                          headers={"authorization": f"Bearer {world.key}"}, timeout=30) as r:
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/event-stream")
            assert r.headers["x-sluice-tier"] == "tier-1"
            raw = r.read()
        events = raw.split(b"\n\n")
        assert events[-1] == b"" and events[-2] == b"data: [DONE]"
        assert all(e.startswith(b"data: ") for e in events[:-1])
        payloads = [orjson.loads(e[6:]) for e in events[:-2]]
        usage_chunks = [p for p in payloads if p.get("usage")]
        if include:
            assert len(usage_chunks) == 1 and payloads[-1]["choices"] == []
        else:
            assert usage_chunks == []  # the gateway asked upstream for usage, not the client


def test_models_lists_allowed_tiers_and_auto(world):
    ids = [m.id for m in world.client().models.list()]
    assert ids == ["auto", "tier-1", "tier-2", "tier-3"]


def test_auto_sends_a_new_workflow_to_the_frontier_with_the_upstream_key(world, frontier):
    raw = world.client().chat.completions.with_raw_response.create(model="auto", messages=MSGS)
    assert raw.headers["x-sluice-tier"] == "tier-3"
    seen = httpx.get(frontier.url + "/stats").json()
    assert seen["last_headers"]["authorization"] == f"Bearer {FRONTIER_KEY}"
    assert seen["last_headers"]["x-request-id"] == raw.headers["x-sluice-request-id"]
    assert seen["last_body"]["model"] == "frontier-model"


def test_upstream_never_sees_the_tenant_key_or_hop_by_hop_headers(world, fake_replicas):
    trace = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    headers = {"authorization": f"Bearer {world.key}", "connection": "keep-alive, x-secret-hop",
               "x-secret-hop": "1", "keep-alive": "timeout=5", "x-app-trace": "abc",
               "traceparent": trace, "openai-organization": "org-theirs",
               "x-data-parallel-rank": "0"}
    r = httpx.post(world.base_url + "/chat/completions", headers=headers, timeout=30,
                   json={"model": "tier-1", "messages": MSGS})
    assert r.status_code == 200
    stats = [httpx.get(s.url + "/stats").json() for s in fake_replicas]
    last = [s for s in stats if s["last_headers"].get("x-request-id")
            == r.headers["x-sluice-request-id"]]
    assert len(last) == 1
    h = last[0]["last_headers"]
    assert "authorization" not in h and world.key not in str(h)
    assert "x-secret-hop" not in h and "keep-alive" not in h
    # an allowlist (security finding 7): trace context passes, nothing else of the client's
    assert h["traceparent"] == trace
    assert "x-app-trace" not in h and "openai-organization" not in h
    assert "x-data-parallel-rank" not in h
    assert last[0]["last_body"]["model"] == "tiny-served"


def test_error_mapping(world):
    client = world.client()
    with pytest.raises(openai.AuthenticationError) as exc:
        world.client(api_key="sk-sl-wrong").chat.completions.create(model="tier-1", messages=MSGS)
    assert exc.value.body["code"] == "invalid_api_key"
    with pytest.raises(openai.NotFoundError) as exc:
        client.chat.completions.create(model="gpt-nope", messages=MSGS)
    assert exc.value.body["param"] == "model" and exc.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model="tier-1", messages=MSGS, temperature=5)
    assert exc.value.body["param"] == "temperature"
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model="tier-1", messages=[{"role": "robot",
                                                                  "content": "x"}])
    assert exc.value.body["param"] == "messages[0].role"
    r = httpx.post(world.base_url + "/chat/completions", content=b"{not json",
                   headers={"authorization": f"Bearer {world.key}"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    r = httpx.post(world.base_url + "/chat/completions", json={"model": "tier-1"},
                   headers={"authorization": f"Bearer {world.key}"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
    big = {"model": "tier-1", "messages": [{"role": "user", "content": "x" * 70_000}]}
    r = httpx.post(world.base_url + "/chat/completions", json=big,
                   headers={"authorization": f"Bearer {world.key}"})
    assert r.status_code == 413 and set(r.json()["error"]) == {"message", "type", "param", "code"}
