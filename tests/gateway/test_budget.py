"""Budgets through the running gateway: an estimate is held while a request is in flight,
the actual cost is counted when it is booked, and a hard stop refuses with a 429."""
from __future__ import annotations

import threading
from decimal import Decimal

import openai
import pytest

from app.core.costing import to_micro
from app.contract import budget as rb
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


def test_a_hard_budget_holds_under_concurrent_load_through_the_gateway(world, redis_client, ns):
    """Many clients at once against a small hard budget: spend never passes the limit (each
    request holds its worst-case estimate while in flight), refused requests get 429
    budget_exceeded, and once the last holds settle the spend is within one request of
    the limit and equals the ledger to the micro-dollar."""
    from concurrent.futures import ThreadPoolExecutor

    import httpx

    from app.core.costing import from_micro
    from app.finops import service
    from app.finops.models import BudgetAlert
    from app.gateway.budget import estimate_usd
    from app.contract.snapshot import Snapshot
    from app.snapshot.service import build_snapshot
    from tests.factories import UserFactory

    body = {"model": "tier-3", "max_tokens": 10, "messages": [
        {"role": "user", "content": "load test [[delay:150]] one two three four five six seven "
                                    "eight nine ten eleven twelve"}]}
    tier3 = Snapshot(build_snapshot()).tiers_by_name["tier-3"]
    est = estimate_usd(body, [tier3], 4096)   # what the gateway holds per request
    limit = est * Decimal("10.5")             # room for 10 requests in flight at once
    service.save_budget(UserFactory(role="finops"), world.tenant.id, str(limit), "hard_stop")
    limit_micro = _state(redis_client, ns, world.tenant.id)["limit_micro"]

    def call(_):
        with httpx.Client(timeout=30) as http:
            r = http.post(world.base_url + "/chat/completions", json=body,
                          headers={"authorization": f"Bearer {world.key}"})
            return r.status_code, r.json()

    with ThreadPoolExecutor(max_workers=24) as pool:
        burst = list(pool.map(call, range(48)))
    ok = [b for s, b in burst if s == 200]
    refused = [b for s, b in burst if s != 200]
    assert refused and ok  # the load hit the stop (holds settle as answers finish, so
    # later requests of the burst may fit again: the bound is on spend, below)
    for b in refused:  # every refusal is the OpenAI quota error, nothing else
        assert b["error"]["code"] == "budget_exceeded"
        assert b["error"]["type"] == "insufficient_quota"
    wait_for(lambda: _state(redis_client, ns, world.tenant.id)["reserved_micro"] == 0,
             what="every hold settled")
    assert _state(redis_client, ns, world.tenant.id)["spent_micro"] <= limit_micro

    # Actual costs are below the held estimates, so room came back: one client at a time
    # uses it until the gateway refuses with nothing in flight.
    while True:
        status, b = call(0)
        if status != 200:
            assert status == 429 and b["error"]["code"] == "budget_exceeded"
            break
        ok.append(b)
        wait_for(lambda: _state(redis_client, ns, world.tenant.id)["reserved_micro"] == 0,
                 what="hold settled")
        assert len(ok) < 48
    st = _state(redis_client, ns, world.tenant.id)
    assert st["reserved_micro"] == 0
    assert st["spent_micro"] <= limit_micro                      # never over
    assert limit_micro - st["spent_micro"] < to_micro(est)        # within one request
    rows = world.drain_rows(len(ok))
    assert len(rows) == len(ok)                                   # one row per answer
    booked = sum(r.cost_usd for r in rows)
    assert booked <= from_micro(limit_micro)
    # the counter rounds each request to the micro-dollar (half up); the reconcile sets it
    # to the ledger's exact sum and finds nothing undrained
    assert abs(to_micro(booked) - st["spent_micro"]) <= len(rows) // 2 + 1
    (rec,) = [r for r in service.reconcile_budget_counters()
              if r["tenant_id"] == world.tenant.id]
    assert rec["after_micro"] == to_micro(booked) and rec["undrained_micro"] == 0
    # the refusals put the budget at 100%: its alert is raised although spend is below
    service.check_budget_alerts()
    assert 100 in {a.threshold_pct for a in
                   service.db.session.scalars(service.sa.select(BudgetAlert).where(
                       BudgetAlert.tenant_id == world.tenant.id))}
