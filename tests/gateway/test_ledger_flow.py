"""Requests through the gateway become ledger rows (cost, baseline, workflow) and
feedback lands on them."""
from __future__ import annotations

from decimal import Decimal

import httpx

from app.core.pricing import baseline_cost, request_cost
from app.extensions import db
from app.ledger.service import drain_stream
from app.workflows.models import Workflow

SYSTEM = {"role": "system", "content": "Classify the ticket. Request 550e8400-e29b-41d4-a716-446655440000"}


def test_rows_cost_baseline_and_workflows(world):
    client = world.client()
    for i in range(3):
        client.chat.completions.create(model="tier-1", messages=[
            {**SYSTEM, "content": SYSTEM["content"].replace("550e8400", f"{min(i, 1)}50e8400")},
            {"role": "user", "content": f"ticket {i}"}])
    client.chat.completions.create(model="tier-2", messages=[{"role": "user", "content": "x"}],
                                   extra_headers={"X-Sluice-Workflow": "adhoc-probe"})
    rows = world.drain_rows(4)
    assert len(rows) == 4 and len({r.request_id for r in rows}) == 4
    snap_tiers = [t.to_dict() for t in world.tiers.values()]
    for r in rows:
        tier = next(t for t in snap_tiers if t["name"] == r.tier)
        assert r.cost_usd == request_cost(tier, r.prompt_tokens, r.cached_tokens,
                                          r.completion_tokens)
        assert r.baseline_cost_usd == baseline_cost(snap_tiers, r.prompt_tokens,
                                                    r.completion_tokens)
        assert r.payload["token_and_latency_telemetry"]["time_to_first_token_ms"] > 0
    # the three templated requests are one workflow; the header names the fourth
    assert len({r.workflow for r in rows[:3]}) == 1
    assert rows[3].workflow == "adhoc-probe"
    wfs = {w.signature: w for w in db.session.scalars(
        db.select(Workflow).where(Workflow.tenant_id == world.tenant.id))}
    assert set(wfs) == {rows[0].workflow, "adhoc-probe"}
    assert wfs["adhoc-probe"].name == "adhoc-probe"
    # same prefix -> same replica (affinity) -> its prefix cache reused, and billed cheaper
    assert rows[1].cached_tokens == 0 and rows[2].cached_tokens > 0
    assert rows[2].cost_usd < rows[1].cost_usd
    assert drain_stream(max_batches=5) == 0  # nothing twice


def test_feedback_reaches_the_ledger_row(world):
    raw = world.client().chat.completions.with_raw_response.create(
        model="tier-1", messages=[{"role": "user", "content": "grade me"}])
    rid = raw.headers["x-sluice-request-id"]
    auth = {"authorization": f"Bearer {world.key}"}
    world.wait_ledger(1)
    r = httpx.post(world.base_url + "/feedback", headers=auth,
                   json={"request_id": rid, "verdict": "fail", "note": "wrong total"})
    assert r.status_code == 202, r.text
    bad = httpx.post(world.base_url + "/feedback", headers=auth,
                     json={"request_id": rid, "verdict": "maybe"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "verdict"
    missing = httpx.post(world.base_url + "/feedback", headers=auth,
                         json={"request_id": "req_nope", "verdict": "pass"})
    assert missing.status_code == 404
    (row,) = world.drain_rows(1)
    assert row.payload["feedback"]["pass"] is False
    assert row.payload["feedback"]["note"] == "wrong total"
    assert row.cost_usd > Decimal(0)


def test_a_drained_workflow_leaves_frontier_first(app, gateway, fake_replicas, frontier):
    from tests.gateway.conftest import health, make_world, wait_for
    w = make_world(app, gateway, [fake_replicas[0].url], frontier.url,
                   policy={"frontier_first_hours": 0})
    client = w.client()
    msgs = [{"role": "system", "content": "Route me."}, {"role": "user", "content": "hi"}]
    first = client.chat.completions.with_raw_response.create(model="auto", messages=msgs)
    assert first.headers["x-sluice-tier"] == "tier-3"  # nobody has seen this workflow
    version = health(w.gateway)["snapshot_version"]
    w.drain_rows(1)  # creates the workflow and publishes the snapshot
    wait_for(lambda: health(w.gateway)["snapshot_version"] > version, what="snapshot reload")
    again = client.chat.completions.with_raw_response.create(model="auto", messages=msgs)
    assert again.headers["x-sluice-tier"] == "tier-2"
