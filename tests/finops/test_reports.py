"""Ledger -> rollup -> report numbers agree to the cent, across a mid-month price change."""
import csv
import io
from decimal import Decimal

import pytest
import sqlalchemy as sa

from app.core import costing
from app.extensions import db
from app.finops import reports, rollups
from app.ledger.models import LedgerEntry
from tests.factories import UserFactory


def ledger_sum(col, tenant_id=None):
    q = sa.select(sa.func.sum(col))
    if tenant_id is not None:
        q = q.where(LedgerEntry.tenant_id == tenant_id)
    return Decimal(db.session.scalar(q))


def test_booked_costs_follow_the_price_in_force(month):
    """The ledger rows (priced by the gateway's booking function from the snapshot's
    schedule, drained from the stream) switch to the frontier's new price at its instant."""
    change = month["change"]
    booked = db.session.scalars(sa.select(LedgerEntry).order_by(LedgerEntry.at)).all()
    assert len(booked) == len(month["rows"])
    rows = [r for r in booked if r.tier == "tier-3"]
    before = [r for r in rows if r.at < change]
    after = [r for r in rows if r.at >= change]
    assert len(before) > 20 and len(after) > 20
    for r in before:  # 5 / 2.50 / 15 per 1M
        want = (Decimal(r.prompt_tokens - r.cached_tokens) * 5
                + r.cached_tokens * Decimal("2.5") + r.completion_tokens * 15) / 10**6
        assert r.cost_usd == costing.to_ledger(want)
    for r in after:  # 4 / 2 / 12 per 1M
        want = (Decimal(r.prompt_tokens - r.cached_tokens) * 4
                + r.cached_tokens * 2 + r.completion_tokens * 12) / 10**6
        assert r.cost_usd == costing.to_ledger(want)
    # the baseline follows the frontier's price too, on the unminified output
    for r in (before[0], after[0], *[b for b in booked if b.cache != "miss"][:5]):
        raw = r.payload["token_and_latency_telemetry"]["raw_schema_output_tokens_equivalent"]
        price = (5, 15) if r.at < change else (4, 12)
        assert r.baseline_cost_usd == costing.to_ledger(
            (Decimal(r.prompt_tokens) * price[0] + raw * price[1]) / 10**6)
    assert all(r.cost_usd == 0 for r in booked if r.cache != "miss")


def test_ledger_rollups_and_every_report_agree_to_the_micro_dollar(month):
    rollups.rebuild_all()
    admin = UserFactory(role="finops")
    period = reports.parse_period(month["period"])
    cost = costing.shown(ledger_sum(LedgerEntry.cost_usd))
    base = costing.shown(ledger_sum(LedgerEntry.baseline_cost_usd))
    assert cost > 0 and base > cost

    dash = reports.dashboard(admin, period)
    assert costing.shown(dash["totals"]["cost"]) == cost
    assert costing.shown(dash["totals"]["baseline"]) == base
    assert dash["totals"]["requests"] == len(month["rows"])
    assert costing.shown(sum(t["cost"] for t in dash["timeline"])) == cost
    assert len(dash["timeline"]) == 31 and dash["grain"] == "day"

    coh = reports.cohorts(admin, period)
    assert coh["total"]["cost_shown"] == cost and coh["total"]["baseline_shown"] == base
    assert sum(r["cost_shown"] for r in coh["rows"]) == cost
    assert sum(r["baseline_shown"] for r in coh["rows"]) == base
    assert {r["category"] for r in coh["rows"]} == {"structured_extraction", "support_rag",
                                                     "code_sql", "complex_reasoning",
                                                     "batch_summarization"}
    extraction = next(r for r in coh["rows"] if r["category"] == "structured_extraction")
    assert extraction["dominant"].split("%")[1].strip().startswith("tier-1")

    show = reports.showback(admin, period)
    assert show["total"]["cost_shown"] == cost
    assert sum(r["cost_shown"] for r in show["rows"]) == cost
    for r in show["rows"]:  # each line within a micro-dollar of its exact sum, lines add up
        exact = ledger_sum(LedgerEntry.cost_usd, r["tenant_id"])
        assert costing.shown(r["cost"]) == costing.shown(exact)
        assert abs(r["cost_shown"] - exact) < Decimal("0.000001")

    header, body = reports.report_rows(admin, "showback", period)
    total_row = body[-1]
    assert Decimal(str(total_row[header.index("chargeback_usd")])) == cost

    # the cohort CSV says what the page says, with the page's sign: cost went down
    header, body = reports.report_rows(admin, "cohorts", period)
    total_row = body[-1]
    assert Decimal(total_row[header.index("actual_usd")]) == coh["total"]["cost_shown"]
    assert Decimal(total_row[header.index("delta_usd")]) == cost - base < 0
    assert float(total_row[header.index("delta_pct")]) == pytest.approx(
        round(coh["total"]["delta_pct"], 2)) and coh["total"]["delta_pct"] < 0

    # Day and hour buckets give the same amounts as the ledger for their windows.
    for start, end, grain in (("2026-10-02", "2026-10-31", "day"),
                              ("2026-10-15", "2026-10-15", "day")):
        p = reports.parse_period(start=start, end=end)
        assert p.grain() == grain
        want = db.session.scalar(sa.select(sa.func.sum(LedgerEntry.cost_usd)).where(
            LedgerEntry.at >= p.start, LedgerEntry.at < p.end))
        got = reports.dashboard(admin, p)
        assert costing.shown(got["totals"]["cost"]) == costing.shown(want)
        assert got["grain"] == ("hour" if p.days <= 3 else "day")


def test_dashboard_shapes_the_seed_headline_and_rates(month):
    rollups.rebuild_all()
    admin = UserFactory(role="viewer")
    d = reports.dashboard(admin, reports.parse_period(month["period"]))
    t = d["totals"]
    assert d["headline"]["per"] == "/mo" and -85 < d["headline"]["delta_pct"] < -60
    assert 80 < t["prefix_hit_pct"] < 95
    assert 10 < t["semantic_hit_pct"] < 30
    assert t["ttft_p50"] < t["ttft_p95"]
    assert t["output_per_request"] < t["raw_output_per_request"]
    assert t["cache_saved"] > 0
    assert {m["tier"] for m in d["tier_mix"]} == {"tier-1", "tier-2", "tier-3", "cache"}
    assert abs(sum(m["pct"] for m in d["tier_mix"]) - 100) < 1e-9


def test_ledger_csv_streams_the_period_rows(month, client):
    from tests.finops.conftest import login
    rollups.rebuild_all()
    admin = UserFactory(role="finops")
    login(client, admin)
    resp = client.get("/finops/export/ledger.csv?period=2026-10")
    assert resp.status_code == 200 and resp.mimetype == "text/csv"
    rows = list(csv.reader(io.StringIO(resp.get_data(as_text=True))))
    assert rows[0][0] == "request_id" and len(rows) == len(month["rows"]) + 1
    total = sum(Decimal(r[rows[0].index("cost_usd")]) for r in rows[1:])
    assert costing.cents(total) == costing.cents(ledger_sum(LedgerEntry.cost_usd))
    assert client.get("/finops/export/ledger.csv?period=2026-09").get_data(as_text=True) \
        .count("\n") == 1
    assert client.get("/finops/export/nope.csv").status_code == 422
