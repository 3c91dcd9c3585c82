"""bench/replay.py at a tiny size: a few requests of the generated month through the real
stack (gateway, worker, reference engines serving a tiny random Llama, the gold frontier),
and the headline read back from the ledger."""
from __future__ import annotations

import argparse
import sys
from decimal import Decimal
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def replay(tmp_path_factory):
    from app.engine.model import build_tiny_llama
    sys.path.insert(0, str(BENCH))
    import replay as bench
    model = build_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny-llama")
    args = argparse.Namespace(
        n=14, seed=3, variants="full", conc=4, t1_replicas=1, t2_replicas=1, screenshot="",
        keep=False, warmup_h=24 * 12, checkpoint_h=72, out="", engine_model=str(model))
    result = bench.run(args, keep_stack=True)
    try:
        yield result
    finally:
        result["stack"].stop()
        sys.path.remove(str(BENCH))


def test_every_request_sent_is_one_ledger_row(replay):
    (res,) = replay["results"]
    sent = [s for s in res["sent"] if s["status"] == 200]
    assert len(sent) == len(res["sent"]) == len(replay["month"].requests)
    assert res["ledger_rows"] == len(sent) == res["headline"]["rows"]
    # both warm-up (frontier-first) and after it (tier 2 without a router) were served
    assert {"frontier_first", "no_router"} <= set(res["headline"]["phases"])


def test_headline_is_read_from_the_ledger(replay):
    import sqlalchemy as sa
    from replay_ledger import headline
    from app.extensions import db
    from app.ledger.models import LedgerEntry as L
    (res,) = replay["results"]
    ids = res["tenant_ids"]
    h = res["headline"]
    cost, base = db.session.execute(sa.select(sa.func.sum(L.cost_usd), sa.func.sum(
        L.baseline_cost_usd)).where(L.tenant_id.in_(ids), L.kind == "request")).one()
    assert (h["cost"], h["baseline"]) == (cost, base) and base > cost
    assert sum(h["stages"].values(), Decimal(0)) == base - cost   # stages add up to the cent
    # change the ledger and the headline follows: one frontier row becomes free
    row = db.session.scalars(sa.select(L).where(L.tenant_id.in_(ids), L.tier == "tier-3")
                             .limit(1)).one()
    old = row.cost_usd
    row.cost_usd = Decimal(0)
    db.session.commit()
    assert headline(ids)["cost"] == h["cost"] - old
    # the verdicts are the feedback the client sent, as the drain wrote them on the rows
    judged = sum(1 for s in res["sent"] if s.get("feedback") == 202)
    assert h["judged"] == judged > 0
    passed = sum(1 for s in res["sent"] if s.get("feedback") == 202 and s["passed"])
    assert h["pass_rate"] == pytest.approx(passed / judged)
