"""Issue 24 in FinOps: savings per stage, quality parity per cohort and the twelve-month
view; the page, the API and the CSV show the same amounts (costing's money rule)."""
import csv
import io
import re
from datetime import datetime, timezone
from decimal import Decimal

import sqlalchemy as sa

from app.core.costing import format_usd
from app.extensions import db
from app.finops import reports, rollups, savings
from app.ledger.models import LedgerEntry
from app.workflows.models import Workflow
from tests.factories import UserFactory
from tests.finops.conftest import PERIOD, api_token, login


def _csv(client, path: str) -> list[list[str]]:
    return list(csv.reader(io.StringIO(client.get(path).get_data(as_text=True))))


def test_stage_lines_add_up_and_page_api_csv_agree(month, client):
    rollups.rebuild_all()
    user = UserFactory(role="finops")
    period = reports.parse_period(PERIOD)
    data = savings.stages(user, period)
    lines = {ln["stage"]: ln for ln in data["lines"]}
    totals = reports.dashboard(user, period)["totals"]
    # the ledger's stages account for the whole saving of the month, to the micro-dollar
    assert sum(ln["amount"] for ln in data["lines"]) == totals["savings"]
    assert sum(ln["amount_shown"] for ln in data["lines"]) == data["savings_shown"]
    assert lines["unattributed"]["amount"] == 0 and lines["gpu_true_up"]["amount"] == 0
    for stage in ("cache", "routing", "minify", "prefix"):
        assert lines[stage]["amount"] > 0, stage
    ledger = db.session.execute(sa.select(sa.func.sum(LedgerEntry.saved_cache_usd)).where(
        LedgerEntry.kind == "request")).scalar()
    assert lines["cache"]["amount"] == ledger == totals["cache_saved"]

    login(client, user)
    page = client.get(f"/finops/savings?period={PERIOD}").get_data(as_text=True)
    assert "chart-stages" in page and "waterfall" in page
    for stage, ln in lines.items():
        row = re.search(rf'data-stage="{stage}"><td>[^<]*</td><td class="num">([^<]+)<', page)
        assert row.group(1) == format_usd(ln["amount_shown"]), stage
    assert re.search(r'id="stage-total">([^<]+)<', page).group(1) == \
        format_usd(data["savings_shown"])
    api = client.get(f"/api/v1/finops/savings?period={PERIOD}",
                     headers={"Authorization": f"Bearer {api_token(user)}"}).get_json()
    assert {ln["stage"]: Decimal(ln["amount_shown"]) for ln in api["lines"]} == \
        {k: ln["amount_shown"] for k, ln in lines.items()}
    rows = _csv(client, f"/finops/export/stages.csv?period={PERIOD}")
    assert rows[0] == ["stage", "label", "saved_usd", "pct_of_baseline"]
    assert {r[0]: r[2] for r in rows[1:-1]} == {
        k: format_usd(ln["amount_shown"], grouped=False, symbol=False) for k, ln in lines.items()}
    assert rows[-1][2] == format_usd(data["savings_shown"], grouped=False, symbol=False)
    # the raw ledger CSV carries each row's stages too
    raw = _csv(client, f"/finops/export/ledger.csv?period={PERIOD}")
    col = raw[0].index("saved_routing_usd")
    assert raw[0][-5:] == [f"saved_{s}_usd" for s in ("cache", "routing", "minify", "prefix",
                                                      "escalation")]
    assert any(Decimal(r[col]) > 0 for r in raw[1:])


def test_twelve_months_run_rate_and_annualised_savings(month, client):
    rollups.rebuild_all()
    user = UserFactory(role="finops")
    period = reports.parse_period(PERIOD)
    month_total = reports.dashboard(user, period)["totals"]
    # as of the 10th of the month: a third of October's 31 days -> projected x 31/9
    now = datetime(2026, 10, 10, tzinfo=timezone.utc)
    year = savings.twelve_months(user, period, now=now)
    assert [m["month"] for m in year["months"]][0] == "2025-11"
    assert [m["month"] for m in year["months"]][-1] == PERIOD
    assert all(m["requests"] == 0 for m in year["months"][:-1])
    assert year["months"][-1]["cost"] == month_total["cost"]
    assert year["run_rate_monthly"] == month_total["cost"] / Decimal(str(9 / 31))
    assert year["annualised_savings"] == month_total["savings"] / Decimal(str(9 / 31)) * 12
    done = savings.twelve_months(user, period, now=datetime(2027, 1, 5, tzinfo=timezone.utc))
    assert done["run_rate_monthly"] == month_total["cost"]   # a month that is over
    assert done["run_rate_annual"] == month_total["cost"] * 12
    assert done["annualised_savings"] == month_total["savings"] * 12

    login(client, user)
    page = client.get(f"/finops/savings?period={PERIOD}").get_data(as_text=True)
    assert "chart-months" in page
    shown_months = re.findall(r'data-month="([\d-]+)"><td>[^<]*</td><td class="num">[^<]*</td>'
                              r'<td class="num">([^<]+)<', page)
    api = client.get(f"/api/v1/finops/months?period={PERIOD}",
                     headers={"Authorization": f"Bearer {api_token(user)}"}).get_json()
    rows = _csv(client, f"/finops/export/months.csv?period={PERIOD}")
    assert rows[0][:3] == ["month", "requests", "actual_usd"]
    assert [(r[0], r[2]) for r in rows[1:-1]] == [
        (m, re.sub(r"[$,]", "", v)) for m, v in shown_months] == [
        (m["month"], format_usd(Decimal(m["cost_shown"]), grouped=False, symbol=False))
        for m in api["months"]]
    # October is over: page and API both annualise its whole saving
    assert re.search(r'id="annualised-savings">([^<]+)<', page).group(1) == \
        format_usd(Decimal(api["annualised_savings_shown"])) == \
        format_usd(month_total["savings"] * 12)
    assert rows[-1][2] == format_usd(Decimal(api["total"]["cost_shown"]), grouped=False,
                                     symbol=False)


def _label(rows, tier_rank: int, passed: bool) -> None:
    for r in rows:
        r.payload = {**r.payload, "tier_rank": tier_rank,
                     "feedback": {"pass": passed, "note": "", "at": None}}


def test_quality_parity_per_cohort_from_feedback_labels(month, client):
    rollups.rebuild_all()
    user = UserFactory(role="finops")
    sigs = list(db.session.scalars(sa.select(Workflow.signature).where(
        Workflow.category == "structured_extraction")))
    rows = list(db.session.scalars(sa.select(LedgerEntry).where(
        LedgerEntry.workflow.in_(sigs), LedgerEntry.cache == "miss").order_by(LedgerEntry.id)))
    assert sum("feedback" in r.payload for r in rows) > 10   # the simulator's own verdicts
    for r in rows:   # this cohort's labels replaced by twenty known ones
        r.payload = {k: v for k, v in r.payload.items() if k not in ("feedback", "tier_rank")}
    rows = rows[:20]
    # tier 1 served ten of them (nine passed), the frontier ten (all passed): served quality
    # 0.5 x 0.9 + 0.5 x 1.0 against a frontier that passed all 19 it is known on -> 95%
    _label(rows[:9], 1, True)
    _label(rows[9:10], 1, False)
    _label(rows[10:], 3, True)
    db.session.commit()
    period = reports.parse_period(PERIOD)
    data = savings.add_quality(reports.cohorts(user, period))
    by_cat = {r["category"]: r for r in data["rows"]}
    got = by_cat["structured_extraction"]
    assert round(got["quality_parity_pct"], 6) == 95.0
    assert (got["quality_n"], got["quality_frontier_n"]) == (20, 19)
    # the other cohorts: the simulator's verdicts (tiers pass 95.5 / 96.2 / 96.8%)
    code = by_cat["code_sql"]
    assert code["quality_n"] > 50 and 90.0 < code["quality_parity_pct"] < 110.0

    login(client, user)
    page = client.get(f"/finops/cohorts?period={PERIOD}").get_data(as_text=True)
    assert "Quality parity" in page and "95.0% <span class=\"muted\">(n=20, f=19)" in page
    api = client.get(f"/api/v1/finops/cohorts?period={PERIOD}",
                     headers={"Authorization": f"Bearer {api_token(user)}"}).get_json()
    api_row = next(r for r in api["rows"] if r["category"] == "structured_extraction")
    assert round(api_row["quality_parity_pct"], 6) == 95.0 and api_row["quality_n"] == 20
    table = _csv(client, f"/finops/export/cohorts.csv?period={PERIOD}")
    col = table[0].index("quality_parity_pct")
    csv_row = next(r for r in table if r[0] == "structured_extraction")
    assert csv_row[col] == "95.00" and csv_row[col + 1] == "20"
