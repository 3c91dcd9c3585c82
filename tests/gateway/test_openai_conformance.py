"""What OpenAI's own SDK reads from the gateway: ``x-request-id`` on every answer (the SDK's
``_request_id``), OpenAI-shaped JSON errors on unknown paths and methods, and
``x-should-retry: false`` on a budget refusal (so the SDK does not retry a 429 that no
retry can fix)."""
from __future__ import annotations

from decimal import Decimal

import httpx
import openai
import pytest

from app.contract import budget as rb
from tests.gateway.conftest import wait_for

MSGS = [{"role": "user", "content": "conformance check"}]


def test_every_answer_carries_x_request_id(world):
    client = world.client()
    raw = client.chat.completions.with_raw_response.create(model="tier-1", messages=MSGS)
    completion = raw.parse()
    assert completion._request_id == raw.headers["x-sluice-request-id"]

    with client.chat.completions.create(model="tier-1", messages=MSGS, stream=True) as stream:
        list(stream)
        assert stream.response.headers["x-request-id"] == \
            stream.response.headers["x-sluice-request-id"]

    models = client.models.with_raw_response.list()
    assert models.headers.get("x-request-id")

    with pytest.raises(openai.AuthenticationError) as exc:
        world.client(api_key="sk-sl-not-a-key").chat.completions.create(model="tier-1",
                                                                       messages=MSGS)
    assert exc.value.request_id

    ids = {httpx.get(world.gateway.url + "/v1/nowhere").headers["x-request-id"]
           for _ in range(3)}
    assert len(ids) == 3  # a fresh id per answer, not a constant


def test_unknown_paths_and_methods_answer_openai_json_errors(world):
    client = world.client()
    with pytest.raises(openai.NotFoundError) as exc:
        client.models.retrieve("tier-1")  # GET /v1/models/tier-1: not served here
    assert exc.value.body["code"] == "unknown_url"
    assert exc.value.body["type"] == "invalid_request_error"

    wrong = httpx.get(world.base_url + "/chat/completions",
                      headers={"authorization": f"Bearer {world.key}"})
    assert wrong.status_code == 405
    assert wrong.headers["content-type"] == "application/json"
    assert wrong.headers["allow"] == "POST"
    assert wrong.json()["error"]["code"] == "method_not_allowed"
    assert wrong.headers["x-request-id"]


def test_a_budget_refusal_tells_the_sdk_not_to_retry(world, redis_client, app):
    ns = app.config["REDIS_NAMESPACE"]
    sent: list[str] = []
    http = httpx.Client(event_hooks={"request": [lambda req: sent.append(req.url.path)]})
    client = openai.OpenAI(base_url=world.base_url, api_key=world.key, max_retries=3,
                           timeout=30, http_client=http)
    client.chat.completions.create(model="tier-1", messages=MSGS)
    wait_for(lambda: rb.state(redis_client, ns, world.tenant.id)["spent_micro"], what="spend")
    rb.mirror_limit(redis_client, ns, world.tenant.id, Decimal("0.000001"), "hard_stop",
                    world.tenant.name)
    sent.clear()
    with pytest.raises(openai.RateLimitError) as exc:
        client.chat.completions.create(model="tier-1", messages=MSGS)
    assert exc.value.body["code"] == "budget_exceeded"
    assert exc.value.response.headers["x-should-retry"] == "false"
    assert sent == ["/v1/chat/completions"]  # one try, although max_retries is 3
