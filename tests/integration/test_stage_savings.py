"""Issue 24: savings per stage, on a ledger built from gateway traffic. Requests go through
the running gateway (the reference engine writes minified JSON on tier 2; a fake "novice"
tier 1 is unsure on long prompts, so S04 escalates those; the fake frontier reports its
prefix-cache reuse; a repeat is an exact cache hit); the drained rows' per-stage columns add
up to baseline - cost on every row and over the ledger, and the rollups keep them."""
from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
import sqlalchemy as sa

from app.core import costing
from app.core.pricing import STAGES, request_cost
from app.extensions import db
from app.finops import rollups
from app.finops.models import Rollup
from app.ledger.models import SAVED_COLUMNS, LedgerEntry
from tests.gateway.conftest import Server, make_world, publish_and_wait, wait_for
from tests.gateway.test_cascade import known_workflow, msgs, publish_router, router_params
from tests.integration.test_minify_engine import FMT, MSGS, _client_got_originals


@pytest.fixture(scope="module")
def novice(tmp_path_factory):
    s = Server("fake", "novice-t1", log_dir=tmp_path_factory.mktemp("logs"))
    yield s
    s.stop()


def _prices(tier) -> dict:
    return {"price_input_per_m": tier.price_input_per_m,
            "price_cached_input_per_m": tier.price_cached_input_per_m,
            "price_output_per_m": tier.price_output_per_m}


def _stages(row: LedgerEntry) -> dict[str, Decimal]:
    return {s: getattr(row, f"saved_{s}_usd") for s in STAGES}


def test_stage_savings_add_up_over_a_ledger_built_from_gateway_traffic(
        app, gateway, engine, novice, frontier, redis_client):
    # tier 1: a fake that is unsure on long prompts (S04 escalates those); tier 2: the
    # reference engine (writes the minified JSON); tier 3: the fake frontier, which reports
    # its prefix-cache reuse
    w = make_world(app, gateway, [novice.url], frontier.url, tier2_urls=[engine.url],
                   policy={"minify_enums": True, "frontier_first_hours": 0,
                           "margin_window_tokens": 2})
    from app.catalog.models import Pool
    db.session.get(Pool, w.tiers[2].pool_id).served_model_name = "tiny-served"  # the engine's
    db.session.commit()
    publish_and_wait(w.gateway)
    c = w.client(timeout=180)
    _client_got_originals(c.chat.completions.create(
        model="tier-2", messages=MSGS, response_format=FMT, max_tokens=200,
        temperature=0).choices[0].message.content)
    system = {"role": "system", "content": "You answer billing questions for the ledger suite."}
    for text in ("first question", "second question"):   # the second reuses the prefix
        c.chat.completions.create(model="tier-3", temperature=0, messages=[
            system, {"role": "user", "content": text}])
    # the cache writes off the request path (one writer thread), so the repeat is a hit only
    # once the answers are stored: the suite once saw a miss, and alone 2 of the 3 were
    # stored when the third answer came back
    ns = app.config["REDIS_NAMESPACE"]
    wait_for(lambda: redis_client.scard(f"{ns}:cache:t:{w.tenant.id}") >= 3,   # all 3 answers
             what="cache store")
    hit = c.chat.completions.with_raw_response.create(model="tier-3", temperature=0, messages=[
        system, {"role": "user", "content": "first question"}])
    assert hit.headers["x-sluice-cache"] == "exact"
    rows_a = w.drain_rows(4)

    known_workflow(w)                                # frontier-first: served by tier 3
    publish_router(w, router_params(0.95, 0.95))     # then the router picks tier 1
    short = c.chat.completions.with_raw_response.create(model="auto", messages=msgs("short one"),
                                                        max_tokens=16)
    assert short.headers["x-sluice-tier"] == "tier-1"
    long_text = " ".join(f"word{i}" for i in range(40))
    long = c.chat.completions.with_raw_response.create(model="auto", messages=msgs(long_text),
                                                       max_tokens=16)
    assert long.headers["x-sluice-tier"] != "tier-1"
    rows_b = w.drain_rows(7)[4:]

    rows = [r for r in rows_a + rows_b if r.kind == "request"]
    assert len(rows) == 7
    for r in rows:   # every row: the stages add up to what it saved, exactly
        assert sum(_stages(r).values()) == r.baseline_cost_usd - r.cost_usd, r.request_id
        told = r.payload["token_and_latency_telemetry"]["savings_by_stage_usd"]
        assert {s: Decimal(v) for s, v in told.items()} == _stages(r)

    minified = rows_a[0]
    mini = minified.payload["pipeline"]["minify"]
    saved_out = mini["raw_schema_output_tokens_equivalent"] - minified.completion_tokens
    assert saved_out > 0
    assert minified.saved_minify_usd == costing.to_ledger(
        saved_out * _prices(w.tiers[2])["price_output_per_m"] / 1_000_000)
    assert minified.saved_routing_usd > 0 and minified.saved_cache_usd == 0

    first, again, cached = rows_a[1], rows_a[2], rows_a[3]
    t3 = _prices(w.tiers[3])
    assert first.cached_tokens == 0 and first.saved_prefix_usd == 0
    assert again.cached_tokens > 0 and again.saved_routing_usd == 0  # the frontier served
    assert again.saved_prefix_usd == costing.to_ledger(
        again.cached_tokens * (t3["price_input_per_m"] - t3["price_cached_input_per_m"])
        / 1_000_000)
    assert cached.cache == "exact" and cached.cost_usd == 0
    assert cached.saved_cache_usd == cached.baseline_cost_usd > 0
    assert sum(v for s, v in _stages(cached).items() if s != "cache") == 0

    frontier_first, served_t1, escalated = rows_b
    assert frontier_first.tier == "tier-3" and frontier_first.saved_routing_usd == 0
    assert served_t1.tier == "tier-1" and served_t1.saved_routing_usd > 0
    assert served_t1.saved_escalation_usd == 0
    # tier 1's attempt was discarded (and tier 2's too when the engine was unsure as well)
    aborted = escalated.payload["attempts"]
    assert aborted[0]["reason"] == "low_margin" and aborted[0]["tier"] == "tier-1"
    assert all(x["reason"] == "low_margin" for x in aborted)
    paid = sum(Decimal(x["cost_usd"]) for x in aborted)
    assert escalated.saved_escalation_usd == -costing.to_ledger(paid) < 0
    served = request_cost(_prices(w.tiers[int(escalated.tier[-1])]), escalated.prompt_tokens,
                          escalated.cached_tokens, escalated.completion_tokens)
    assert escalated.cost_usd == costing.to_ledger(served + paid)

    # over the ledger: per-stage sums add up to the total saving (to the micro-dollar, and
    # in fact exactly), every stage is represented
    tenants = [w.tenant.id]
    L = LedgerEntry
    sums = db.session.execute(sa.select(
        sa.func.sum(L.baseline_cost_usd), sa.func.sum(L.cost_usd),
        *[sa.func.sum(getattr(L, c)) for c in SAVED_COLUMNS]).where(
        L.tenant_id.in_(tenants), L.kind == "request")).one()
    baseline, cost, *stages = sums
    by_stage = dict(zip(STAGES, stages))
    assert sum(stages) == baseline - cost
    assert costing.shown(sum(costing.allocate(stages))) == costing.shown(baseline - cost)
    assert by_stage["cache"] > 0 and by_stage["routing"] > 0 and by_stage["minify"] > 0
    assert by_stage["prefix"] > 0 and by_stage["escalation"] < 0

    # the rollups keep each stage, and agree with the ledger
    rollups.rebuild(min(r.at for r in rows), max(r.at for r in rows) + timedelta(seconds=1))
    rolled = db.session.execute(sa.select(
        *[sa.func.sum(getattr(Rollup, c)) for c in SAVED_COLUMNS]).where(
        Rollup.grain == "month", Rollup.tenant_id.in_(tenants))).one()
    assert list(rolled) == stages
    # and FinOps' stage lines account for the whole saving, nothing unattributed
    from app.finops import reports, savings
    from tests.factories import UserFactory
    period = reports.Period(min(r.at for r in rows).replace(minute=0, second=0, microsecond=0),
                            max(r.at for r in rows) + timedelta(hours=1), "traffic")
    shown = savings.stages(UserFactory(role="finops"), period, w.tenant.id)
    lines = {ln["stage"]: ln["amount"] for ln in shown["lines"]}
    assert {s: lines[s] for s in STAGES} == by_stage
    assert lines["unattributed"] == 0 and lines["gpu_true_up"] == 0
    assert sum(ln["amount_shown"] for ln in shown["lines"]) == shown["savings_shown"] == \
        costing.shown(baseline - cost)
