"""Budgets through the running gateway: an estimate is held while a request is in flight,
the actual cost is counted when it is booked, and a hard stop refuses with a 429."""
from __future__ import annotations

import threading
from decimal import Decimal

import openai
import pytest

from app.core.costing import to_micro
from app.finops import budget as rb
from tests.gateway.conftest import wait_for

MSGS = [{"role": "user", "content": "budget check please"}]


@pytest.fixture()
def ns(app):
    return app.config["REDIS_NAMESPACE"]


def _state(redis_client, ns, tenant_id):
    return rb.state(redis_client, ns, tenant_id)


def test_actual_cost_is_counted_and_hold_released(world, redis_client, ns):
    client = world.client()
    raw = client.chat.completions.with_raw_response.create(model="tier-3", messages=MSGS,
                                                           max_tokens=50)
    cost = Decimal(raw.headers["x-sluice-cost-usd"])
    assert cost > 0
    rows = world.drain_rows(1)
    st = wait_for(lambda: (s := _state(redis_client, ns, world.tenant.id))["spent_micro"] and s,
                  what="settle")
    assert st["spent_micro"] == to_micro(rows[0].cost_usd) == to_micro(cost)
    assert st["reserved_micro"] == 0


def test_in_flight_request_holds_its_estimate(world, redis_client, ns):
    client = world.client()
    done = threading.Event()

    def slow():
        try:
            client.chat.completions.create(model="tier-3", max_tokens=100, messages=[
                {"role": "user", "content": "slow one [[delay:3000]]"}])
        finally:
            done.set()

    t = threading.Thread(target=slow)
    t.start()
    held = wait_for(lambda: _state(redis_client, ns, world.tenant.id)["reserved_micro"],
                    what="reservation while in flight")
    # at least 100 output tokens at the frontier's $10.50/M
    assert held >= to_micro(Decimal(100) * Decimal("10.50") / 1_000_000)
    assert done.wait(30)
    t.join(10)
    wait_for(lambda: _state(redis_client, ns, world.tenant.id)["reserved_micro"] == 0,
             what="hold released")


def test_hard_stop_refuses_with_openai_quota_error(world, redis_client, ns):
    client = world.client()
    client.chat.completions.create(model="tier-1", messages=MSGS)
    wait_for(lambda: _state(redis_client, ns, world.tenant.id)["spent_micro"], what="spend")
    # room for a small tier-1 answer, not for a tier-3 request with a large max_tokens
    rb.mirror_limit(redis_client, ns, world.tenant.id, Decimal("0.001"), "hard_stop",
                    world.tenant.name)
    client.chat.completions.create(model="tier-1", messages=MSGS, max_tokens=20)
    with pytest.raises(openai.RateLimitError) as exc:
        client.chat.completions.create(model="tier-3", messages=MSGS, max_tokens=4000)
    body = exc.value.body
    assert body["code"] == "budget_exceeded" and body["type"] == "insufficient_quota"
    assert body["message"].startswith("Monthly budget of $0.00")
    # a refused request holds nothing; spending past the limit refuses everything
    assert _state(redis_client, ns, world.tenant.id)["reserved_micro"] == 0
    rb.mirror_limit(redis_client, ns, world.tenant.id, Decimal("0.000001"), "hard_stop",
                    world.tenant.name)
    with pytest.raises(openai.RateLimitError):
        client.chat.completions.create(model="tier-1", messages=MSGS, max_tokens=1)
    # alert-only budgets never refuse
    rb.mirror_limit(redis_client, ns, world.tenant.id, Decimal("0.000001"), "alert",
                    world.tenant.name)
    client.chat.completions.create(model="tier-1", messages=MSGS, max_tokens=1)
