"""The template lint fed by live traffic: the gateway samples each workflow's system prompt
after the answer, and the Routing page shows where it turns dynamic and the prefix tokens
that costs per day."""
from __future__ import annotations

import asyncio
import time

import httpx
import redis.asyncio as aioredis

from app.contract.keys import Keys
from app.contract.lint import KEEP, LintSampler, _day, analyze_workflow, lint_report
from tests.factories import UserFactory
from tests.gateway.conftest import make_world, wait_for

STATIC = ("You are the invoice assistant of Acme. Follow the rules below.\n"
          + "Rule: totals are in EUR, amounts have two decimals, cite the invoice line. " * 60)


def _prompt(minute: int) -> str:
    return f"Current time: 2026-12-03T10:{minute:02d}:00Z\n{STATIC}"


def test_sampler_writes_once_per_interval_and_keeps_the_count(app, redis_client):
    ns = app.config["REDIS_NAMESPACE"]
    now = [1000.0]

    async def scenario() -> None:
        r = aioredis.Redis.from_url(app.config["REDIS_URL"])
        sampler = LintSampler(r, ns, interval_s=60.0)
        body = {"messages": [{"role": "system", "content": _prompt(1)},
                             {"role": "user", "content": "total of INV-7?"}]}
        writes = [sampler.note(9, "wf-a", body, clock=lambda: now[0]) for _ in range(5)]
        assert sum(w is not None for w in writes) == 1       # first of the minute only
        await writes[0]
        now[0] += 61
        body["messages"][0]["content"] = _prompt(2)
        await sampler.note(9, "wf-a", body, clock=lambda: now[0])  # 4 held + this one
        assert sampler.note(9, "wf-a", body, clock=lambda: now[0]) is None
        await sampler.flush()                                  # the one held since
        assert sampler.pending == {}
        await r.aclose()

    asyncio.run(scenario())
    row = analyze_workflow(redis_client, ns, "9:wf-a")
    assert row["samples"] == 2 and row["samples"] <= KEEP
    assert row["kind"] == "timestamp" and row["confirmed"]
    today = [k for k in redis_client.scan_iter(f"{ns}:lint:9:wf-a:n:*")]
    assert len(today) == 1 and int(redis_client.get(today[0])) == 7


def test_a_request_through_the_gateway_shows_up_in_the_lint(app, client, gateway, frontier,
                                                            fake_replicas, redis_client):
    w = make_world(app, gateway, [s.url for s in fake_replicas], frontier.url)
    ns = app.config["REDIS_NAMESPACE"]
    # yesterday's count is the rate the report uses: without one it scales today's count
    # by the time since midnight, which moves between the row read here and the page's
    # (one token a day apart: a flaky comparison under a loaded suite)
    wf = f"{w.tenant.id}:invoice-bot"
    redis_client.set(Keys(ns).lint_requests(wf, _day(time.time() - 86400)), 40, ex=3600)
    resp = httpx.post(w.base_url + "/chat/completions", timeout=30,
                      headers={"authorization": f"Bearer {w.key}",
                               "x-sluice-workflow": "invoice-bot"},
                      json={"model": "tier-1", "messages": [
                          {"role": "system", "content": _prompt(15)},
                          {"role": "user", "content": "What is the total of INV-7?"}]})
    assert resp.status_code == 200, resp.text

    def row():
        rows = [r for r in lint_report(redis_client, ns, tenant_id=w.tenant.id)
                if r["workflow"] == "invoice-bot"]
        return rows[0] if rows else None

    r = wait_for(row, what="the gateway's lint sample")
    assert r["samples"] == 1 and r["kind"] == "timestamp"
    assert r["first_dynamic_token"] <= 4                   # line 1: "Current time: "
    assert r["tokens_lost_per_request"] == r["prompt_tokens"] - r["first_dynamic_token"] > 1000
    assert r["requests_per_day"] == 40.0
    assert abs(r["tokens_lost_per_day"]
               - r["tokens_lost_per_request"] * r["requests_per_day"]) <= r["prompt_tokens"]

    with client.session_transaction() as s:
        s["_user_id"] = UserFactory(role="viewer", tenant=w.tenant).get_id()
        s["_fresh"] = True
    page = client.get("/routing/").text
    assert "invoice-bot" in page and "2026-12-03T10:15:00Z" in page
    assert f"{r['tokens_lost_per_day']:,}" in page
