"""Security finding 7: engine-only request fields never come from a client: a client
cannot pick another tenant's cache salt, jump the engine queue, or have the engine render
a template of its own. Such fields are refused with an OpenAI-style 400."""
from __future__ import annotations

import httpx
import pytest

ENGINE_ONLY = {"cache_salt": "another-tenants-salt", "priority": -100,
               "chat_template": "{{ 'pwned' }}", "chat_template_kwargs": {"x": 1},
               "kv_transfer_params": {"do_remote_decode": True},
               "structured_outputs": {"grammar": "root ::= \"x\""},
               "guided_json": {"type": "object"}, "request_id": "mine",
               "add_generation_prompt": False, "vllm_xargs": {"a": 1}}


@pytest.mark.parametrize("field", sorted(ENGINE_ONLY))
def test_engine_only_fields_are_refused(world, fake_replicas, field):
    before = sum(httpx.get(s.url + "/stats").json()["requests"] for s in fake_replicas)
    r = httpx.post(world.base_url + "/chat/completions", timeout=30,
                   headers={"authorization": f"Bearer {world.key}"},
                   json={"model": "tier-1", "messages": [{"role": "user", "content": "hi"}],
                         field: ENGINE_ONLY[field]})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == field
    after = sum(httpx.get(s.url + "/stats").json()["requests"] for s in fake_replicas)
    assert after == before          # nothing reached an engine


def test_the_gateway_still_sets_the_tenants_own_salt(world, fake_replicas):
    r = httpx.post(world.base_url + "/chat/completions", timeout=30,
                   headers={"authorization": f"Bearer {world.key}"},
                   json={"model": "tier-1", "top_k": 20,
                         "messages": [{"role": "user", "content": "salted"}]})
    assert r.status_code == 200
    bodies = [httpx.get(s.url + "/stats").json()["last_body"] for s in fake_replicas]
    body = next(b for b in bodies if b and b["messages"][-1]["content"] == "salted")
    assert len(body["cache_salt"]) == 32 and body["top_k"] == 20
