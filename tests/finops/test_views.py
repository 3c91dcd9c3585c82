"""Console pages, admin API and CSV: a department lead sees only their own tenant."""
import csv
import io
from decimal import Decimal

import sqlalchemy as sa

from app.extensions import db
from app.finops import rollups
from app.finops.models import Budget
from tests.factories import UserFactory
from tests.finops.conftest import api_token, csrf_of, login


def test_pages_render_with_data_and_plotly_is_served_locally(month, client):
    rollups.rebuild_all()
    login(client, UserFactory(role="finops"))
    page = client.get("/finops?period=2026-10").get_data(as_text=True)
    assert "/finops/plotly.js" in page and "chart-spend" in page and "cdn" not in page.lower()
    assert "Baseline <strong>$" in page and "/mo" in page
    cohorts = client.get("/finops/cohorts?period=2026-10").get_data(as_text=True)
    assert "Structured JSON Extraction &amp; Classification" in cohorts
    assert "revops" in client.get("/finops/showback?period=2026-10").get_data(as_text=True)
    js = client.get("/finops/plotly.js")
    assert js.status_code == 200 and "max-age=31536000" in js.headers["Cache-Control"]
    assert len(js.data) > 1_000_000
    again = client.get("/finops/plotly.js", headers={"If-None-Match": js.headers["ETag"]})
    assert again.status_code == 304


def test_department_lead_sees_only_their_department(month, client):
    rollups.rebuild_all()
    revops, legal = month["tenants"]
    lead = UserFactory(role="viewer", tenant=legal)
    login(client, lead)
    # console: every page is the lead's tenant only; asking for another is refused
    show = client.get("/finops/showback?period=2026-10").get_data(as_text=True)
    assert "legal" in show and "revops" not in show and "Revenue Ops" not in show
    dash = client.get("/finops?period=2026-10").get_data(as_text=True)
    assert "All tenants" not in dash
    for path in (f"/finops?period=2026-10&tenant={revops.id}",
                 f"/finops/cohorts?period=2026-10&tenant={revops.id}",
                 f"/finops/showback?tenant={revops.id}",
                 f"/finops/export/showback.csv?tenant={revops.id}",
                 f"/finops/export/ledger.csv?period=2026-10&tenant={revops.id}"):
        assert client.get(path).status_code == 403, path
    # CSV: only legal's rows
    rows = list(csv.reader(io.StringIO(client.get(
        "/finops/export/ledger.csv?period=2026-10").get_data(as_text=True))))
    tenant_col = rows[0].index("tenant_id")
    assert rows[1:] and {r[tenant_col] for r in rows[1:]} == {str(legal.id)}
    show_csv = list(csv.reader(io.StringIO(client.get(
        "/finops/export/showback.csv?period=2026-10").get_data(as_text=True))))
    assert [r[1] for r in show_csv[1:]] == ["legal", "Total"]
    # API: same scope
    headers = {"Authorization": f"Bearer {api_token(lead)}"}
    data = client.get("/api/v1/finops/showback?period=2026-10", headers=headers).get_json()
    assert [r["tenant"] for r in data["rows"]] == ["legal"]
    assert client.get(f"/api/v1/finops/dashboard?period=2026-10&tenant={revops.id}",
                      headers=headers).status_code == 403
    assert client.get(f"/api/v1/finops/export/ledger.csv?tenant={revops.id}",
                      headers=headers).status_code == 403
    mine = client.get("/api/v1/finops/dashboard?period=2026-10", headers=headers).get_json()
    everyone = client.get("/api/v1/finops/dashboard?period=2026-10", headers={
        "Authorization": f"Bearer {api_token(UserFactory(role='viewer'))}"}).get_json()
    assert mine["tenant_id"] == legal.id
    assert int(mine["totals"]["requests"]) < int(everyone["totals"]["requests"])
    assert client.get("/api/v1/finops/dashboard").status_code == 401


def test_setting_a_budget_in_the_console_needs_the_role_and_csrf(app, client, month):
    legal = month["tenants"][1]
    login(client, UserFactory(role="finops"))
    page = client.get("/finops/budgets").get_data(as_text=True)
    form = {"tenant_id": legal.id, "monthly_limit_usd": "500", "action": "hard_stop",
            "webhook_url": ""}
    assert client.post("/finops/budgets", data=form).status_code == 400  # no CSRF token
    resp = client.post("/finops/budgets", data={**form, "csrf_token": csrf_of(page)})
    assert resp.status_code == 302
    assert db.session.scalar(sa.select(Budget.action).where(Budget.tenant_id == legal.id)) == \
        "hard_stop"
    page = client.get("/finops/budgets").get_data(as_text=True)
    assert "hard stop" in page and "$500.00" in page
    bad = client.post("/finops/budgets", data={**form, "monthly_limit_usd": "lots",
                                               "csrf_token": csrf_of(page)})
    assert bad.status_code == 422 and "not a number" in bad.get_data(as_text=True)


def test_a_viewer_cannot_set_budgets_anywhere(app, client, month):
    viewer = UserFactory(role="viewer")
    login(client, viewer)
    page = client.get("/finops/budgets").get_data(as_text=True)
    assert "budget-form" not in page
    resp = client.post("/finops/budgets", data={
        "tenant_id": month["tenants"][0].id, "monthly_limit_usd": "5", "action": "alert",
        "csrf_token": csrf_of(page)})
    assert resp.status_code == 403
    headers = {"Authorization": f"Bearer {api_token(viewer)}"}
    assert client.put(f"/api/v1/finops/budgets/{month['tenants'][0].id}", headers=headers,
                      json={"monthly_limit_usd": "5"}).status_code == 403
    assert db.session.scalar(sa.select(sa.func.count()).select_from(Budget)) == 0


def test_api_budget_adjustment_and_rebuild(app, client, month):
    admin = UserFactory(role="admin")
    headers = {"Authorization": f"Bearer {api_token(admin)}"}
    revops = month["tenants"][0]
    r = client.put(f"/api/v1/finops/budgets/{revops.id}", headers=headers,
                   json={"monthly_limit_usd": "1000", "action": "alert"})
    assert r.status_code == 200 and Decimal(r.get_json()["monthly_limit_usd"]) == 1000
    r = client.post("/api/v1/finops/adjustments", headers=headers,
                    json={"tenant_id": revops.id, "amount": "-2.5", "reason": "credit"})
    assert r.status_code == 201 and r.get_json()["amount_usd"].startswith("-2.5")
    r = client.post("/api/v1/finops/rollups/rebuild", headers=headers, json={"period": "2026-10"})
    assert r.status_code == 200 and r.get_json()["differences"] == []
    budgets = client.get("/api/v1/finops/budgets", headers=headers).get_json()
    assert Decimal(budgets["budgets"][0]["spent_usd"]) == Decimal("-2.5")


def test_money_in_the_api_is_fixed_point_never_scientific(app, month, client):
    """Flask writes a Decimal with str(): a third of a micro-dollar came out as
    "3.200E-7" and a zero sum of ledger costs as "0E-10" (seen by hand on the dashboard
    API) where the page and the CSV show fixed point."""
    import json
    import re

    from app.ledger.models import LedgerEntry
    assert json.loads(app.json.dumps({"a": Decimal("0.0000003200"), "b": Decimal("0E-10")})) \
        == {"a": "0.0000003200", "b": "0.0000000000"}
    row = db.session.scalars(sa.select(LedgerEntry).where(
        LedgerEntry.tenant_id == month["tenants"][0].id).limit(1)).one()
    row.usage_source, row.cost_usd = "counted", Decimal("0.00000032")
    db.session.commit()
    headers = {"Authorization": f"Bearer {api_token(UserFactory(role='finops'))}"}
    got = client.get("/api/v1/finops/dashboard?period=2026-10", headers=headers)
    assert got.status_code == 200
    counted = got.get_json()["counted"]
    assert counted["requests"] == 1 and Decimal(counted["cost"]) == Decimal("0.00000032")
    assert counted["cost"].startswith("0.00000032"), counted
    text = got.get_data(as_text=True)
    assert not re.search(r'"-?\d+(\.\d+)?E[-+]?\d+"', text), re.findall(r'"[^"]*E-\d+"', text)
