"""bench/replay.py at a tiny size: a few requests of the generated month through the real
stack (gateway, worker, reference engines serving a tiny random Llama, the gold frontier),
after one prior month through the same tenants (steady state), and the headline read back
from the ledger rows of the measured month only."""
from __future__ import annotations

import argparse
import sys
from decimal import Decimal
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _replay(tmp_path_factory, **kw):
    """bench.run on the tiny model through a real stack, kept up for the tests; stopped after."""
    from app.engine.model import build_tiny_llama
    sys.path.insert(0, str(BENCH))
    import replay as bench
    model = build_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny-llama")
    args = argparse.Namespace(
        variants="full", conc=4, t1_replicas=1, t2_replicas=1, screenshot="", keep=False,
        checkpoint_h=72, out="", engine_model=str(model), prior_months=1, **kw)
    result = bench.run(args, keep_stack=True)
    try:
        yield result
    finally:
        result["stack"].stop()
        sys.path.remove(str(BENCH))


@pytest.fixture(scope="module")
def replay(tmp_path_factory):
    yield from _replay(tmp_path_factory, n=14, seed=3, warmup_h=24 * 12)


def test_every_request_sent_is_one_ledger_row(replay):
    import sqlalchemy as sa
    from replay_ledger import count_rows, headline
    from app.extensions import db
    from app.ledger.models import LedgerEntry as L
    (res,) = replay["results"]
    sent = [s for s in res["sent"] if s["status"] == 200]
    assert len(sent) == len(res["sent"]) == len(replay["month"].requests)
    assert res["ledger_rows"] == len(sent) == res["headline"]["rows"]
    # the prior month went through the same tenants and is in the ledger, not in the figures
    total, _ = count_rows(res["tenant_ids"])
    assert res["prior_months"] == 1 and total > len(sent)
    assert headline(res["tenant_ids"])["rows"] == total
    measured = set(db.session.scalars(sa.select(L.request_id).where(
        L.tenant_id.in_(res["tenant_ids"]), L.kind == "request", L.at >= res["since"])))
    assert measured == {s["rid"] for s in sent}
    # the warm-up (frontier-first) ended in the prior month: in the measured month only a
    # workflow the prior month never sent is new; the others are past it (tier 2, no router)
    rows = db.session.execute(sa.select(L.tenant_id, L.workflow, L.at, L.payload).where(
        L.tenant_id.in_(res["tenant_ids"]), L.kind == "request", L.cache == "miss")).all()
    reason = lambda p: ((p or {}).get("caching_and_routing_decision") or {}).get("route_reason")
    seen_before = {(t, w) for t, w, at, _ in rows if at < res["since"]}
    after = [((t, w) in seen_before, reason(p)) for t, w, at, p in rows if at >= res["since"]]
    assert any(reason(p) == "frontier_first" for _, _, at, p in rows if at < res["since"])
    assert ("frontier_first" in {r for seen, r in after if seen}) is False
    assert (True, "no_router") in after


def test_headline_is_read_from_the_ledger(replay):
    import sqlalchemy as sa
    from replay_ledger import headline
    from app.extensions import db
    from app.ledger.models import LedgerEntry as L
    (res,) = replay["results"]
    ids = res["tenant_ids"]
    h = res["headline"]
    since = res["since"]
    cost, base = db.session.execute(sa.select(sa.func.sum(L.cost_usd), sa.func.sum(
        L.baseline_cost_usd)).where(L.tenant_id.in_(ids), L.kind == "request",
                                    L.at >= since)).one()
    assert (h["cost"], h["baseline"]) == (cost, base) and base > 0
    assert sum(h["stages"].values(), Decimal(0)) == base - cost   # stages add up to the cent
    # change the ledger and the headline follows: one frontier row becomes free
    row = db.session.scalars(sa.select(L).where(L.tenant_id.in_(ids), L.tier == "tier-3",
                                                L.at >= since).limit(1)).one()
    old = row.cost_usd
    row.cost_usd = Decimal(0)
    db.session.commit()
    assert headline(ids, since=since)["cost"] == h["cost"] - old
    # the verdicts are the feedback the client sent, as the drain wrote them on the rows
    judged = sum(1 for s in res["sent"] if s.get("feedback") == 202)
    assert h["judged"] == judged > 0
    passed = sum(1 for s in res["sent"] if s.get("feedback") == 202 and s["passed"])
    assert h["pass_rate"] == pytest.approx(passed / judged)


@pytest.fixture(scope="module")
def ablation(tmp_path_factory):
    """The steady-state ablation: one prior month, then the measured month once per pass
    from the state it left (the last pass repeats the first: same state, same stage). Seed 19
    repeats a support question of the prior month (same tenant); the warm-up spans both months, so the
    frontier (gold) answers everything and every answer passes and stays cached."""
    yield from _replay(tmp_path_factory, n=30, seed=19, warmup_h=24 * 61,
                       ablate="full,no_cache,no_routing,full")


def _hit_source(payload) -> str | None:
    """The request whose cached answer a hit served (S00's telemetry on the ledger row)."""
    return (((payload or {}).get("pipeline") or {}).get("cache_hit") or {}).get("of_request")


def test_ablation_passes_start_from_one_state_and_read_their_own_rows(ablation):
    import sqlalchemy as sa
    from app.extensions import db
    from app.ledger.models import LedgerEntry as L
    (res,) = ablation["results"]
    passes = res["ablation"]
    assert [a["name"] for a in passes] == ["full", "no_cache", "no_routing", "full"]
    ids = res["tenant_ids"]
    n = len(ablation["month"].requests)
    prior = {s["rid"] for month in res["sent_prior"] for s in month}
    earlier: set[str] = set()
    for a in passes:
        rows = db.session.execute(sa.select(L.request_id, L.cache, L.tier, L.payload).where(
            L.tenant_id.in_(ids), L.kind == "request", L.at >= a["since"],
            L.at < a["until"])).all()
        # each pass is the whole month, and its figures are its own rows
        assert {r.request_id for r in rows} == {s["rid"] for s in a["sent"]}
        assert len(rows) == n == a["headline"]["rows"]
        hits = [r for r in rows if r.cache != "miss"]
        # the cache is the fork's before every pass: a hit is served from the prior month or
        # from this pass, never from a pass before it (their entries were dropped)
        sources = {_hit_source(r.payload) for r in hits}
        assert None not in sources
        assert not sources & earlier, a["name"]
        if a["name"] == "no_cache":
            assert not hits
        if a["name"] == "no_routing":
            assert {r.tier for r in rows if r.cache == "miss"} == {"tier-3"}
        # learning frozen: the routers a pass starts with are the ones it ends with
        assert a["routers_after"] == a["routers_before"]
        earlier |= {r.request_id for r in rows}
    # the prior month's entries are restored for every pass: a cached repeat across months
    # hits in the first pass and again in the last
    first, last = passes[0], passes[-1]
    from_prior = lambda a: {s for s in (_hit_source(p) for (p,) in db.session.execute(
        sa.select(L.payload).where(L.tenant_id.in_(ids), L.kind == "request",
                                   L.at >= a["since"], L.at < a["until"]))) if s in prior}
    assert from_prior(first) and from_prior(first) == from_prior(last)
    # the policy the passes changed is the fork's again
    stack = ablation["stack"]
    assert all(stack.policy_values(t).get("cache_enabled", True) is True for t in ids)
    assert "explore_pct" not in stack.policy_values(ids[0]) or \
        stack.policy_values(ids[0])["explore_pct"] != 0.0
    text = ablation["text"]
    assert "Ablation: the measured month replayed once per row" in text
    assert "routers during pass no_cache: unchanged" in text
