"""The Overview: today's traffic, money, cache, errors and 429s against yesterday, from
the same rollups as FinOps; pools, alerts, drills and adapter events; scoped to a
tenant-scoped user's tenant; "Refresh figures now" brings the rollups up to the ledger."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone
from decimal import Decimal

import pytest

from app.catalog.service import sync_replica_rows
from app.extensions import db
from app.finops.models import BudgetAlert
from app.ledger.models import LedgerEntry
from app.redis_client import get_redis, keys
from tests.console.web import csrf_from
from tests.factories import PoolFactory


@pytest.fixture(autouse=True)
def _fresh_rollup_marks(app):
    r = get_redis()
    r.delete(keys().rollup_watermark(), keys().rollup_ran_at())


def _book(tenant, n: int, *, at=None, status=200, cost="0.000123", cache="miss", tag=""):
    at = at or datetime.now(timezone.utc)
    db.session.add_all([LedgerEntry(
        request_id=f"req_ov_{tenant.id}_{tag}{status}_{i}", tenant_id=tenant.id, at=at,
        tier="tier-1" if cache == "miss" else "", status=status, cache=cache,
        cost_usd=Decimal(cost) if cache == "miss" else Decimal(0),
        baseline_cost_usd=Decimal("0.0021"), prompt_tokens=40, completion_tokens=8,
        ttft_ms=25.0, payload={}) for i in range(n)])
    db.session.commit()


def _refresh(client):
    page = client.get("/").get_data(as_text=True)
    resp = client.post("/overview/refresh", data={"csrf_token": csrf_from(page), "next": "/"})
    assert resp.status_code == 302 and resp.headers["Location"].endswith("/")
    return client.get("/").get_data(as_text=True)


def _kpi(html: str, name: str) -> str:
    return html.split(f'id="kpi-{name}"', 1)[1].split('class="v">', 1)[1].split("<", 1)[0]


def test_overview_shows_today_against_yesterday_once_the_rollup_ran(client, as_role,
                                                                   two_tenants):
    alpha, bravo = two_tenants
    as_role("ops")
    now = datetime.now(timezone.utc)
    _book(alpha, 8)                                   # 8 x $0.000123 = $0.000984
    _book(alpha, 2, cache="exact", tag="hit")
    _book(alpha, 1, status=429, cost="0", tag="r")
    _book(bravo, 4, at=now - timedelta(days=1), tag="y")
    before = client.get("/").get_data(as_text=True)
    assert _kpi(before, "requests") == "0" and "none yet" in before   # not rolled up yet
    html = _refresh(client)
    assert _kpi(html, "requests") == "11"
    assert _kpi(html, "spend") == "$0.000984"          # sub-cent, as FinOps shows it
    assert "Figures as of" in html and "none yet" not in html
    assert "+175% vs yesterday" in html                # 11 today, 4 yesterday
    assert _kpi(html, "cache") == "18.2%"               # 2 of 11
    assert "429s 9.09%" in html and _kpi(html, "errors") == "0.00%"
    assert 'href="/finops"' in html and 'href="/pools"' in html


def test_pools_alerts_and_drills_show_for_global_users(client, as_role, two_tenants):
    alpha, _ = two_tenants
    pool = PoolFactory(name="t1-pool", desired_replicas=2)
    sync_replica_rows(pool)
    pool.replicas[0].state = "healthy"
    db.session.add(BudgetAlert(tenant_id=alpha.id, period="2026-12", threshold_pct=80,
                               spent_usd=Decimal("0.0046")))
    db.session.commit()
    as_role("viewer")
    html = client.get("/").get_data(as_text=True)
    pools = html.split('id="pools"', 1)[1].split("</section>", 1)[0]
    assert "t1-pool" in pools and "1 of 2 wanted healthy" in pools
    alerts = html.split('id="alerts"', 1)[1].split("</section>", 1)[0]
    assert "alpha" in alerts and "80%" in alerts and "$0.0046" in alerts
    assert 'id="drills"' in html


def test_a_tenant_scoped_user_sees_only_their_tenant(client, as_role, two_tenants):
    alpha, bravo = two_tenants
    _book(alpha, 3)
    _book(bravo, 5)
    db.session.add(BudgetAlert(tenant_id=bravo.id, period="2026-12", threshold_pct=50,
                               spent_usd=Decimal("1")))
    db.session.commit()
    as_role("viewer", tenant=alpha)
    html = _refresh(client)
    assert _kpi(html, "requests") == "3"
    assert 'id="pools"' not in html and 'id="drills"' not in html
    assert "bravo" not in html.split('id="alerts"', 1)[1].split("</section>", 1)[0]


def test_empty_overview_says_what_will_appear(client, as_role):
    as_role("viewer")
    html = client.get("/").get_data(as_text=True)
    assert 'id="no-traffic"' in html and "within one rollup" in html
    assert '<meta http-equiv="refresh" content="30">' in html


def test_refresh_only_goes_back_to_this_site(client, as_role):
    as_role("viewer")
    page = client.get("/").get_data(as_text=True)
    resp = client.post("/overview/refresh", data={"csrf_token": csrf_from(page),
                                                  "next": "//evil.example/"})
    assert resp.headers["Location"].endswith("/") and "evil" not in resp.headers["Location"]


def test_finops_pages_say_as_of_when_and_refresh_back_to_themselves(client, as_role,
                                                                    two_tenants):
    alpha, _ = two_tenants
    as_role("finops")
    _book(alpha, 2)
    html = client.get("/finops/cohorts?period=2026-12").get_data(as_text=True)
    assert "no rollup yet" in html
    resp = client.post("/overview/refresh", data={"csrf_token": csrf_from(html),
                                                  "next": "/finops/cohorts?period=2026-12"})
    assert resp.headers["Location"].endswith("/finops/cohorts?period=2026-12")
    after = client.get("/finops/cohorts?period=2026-12").get_data(as_text=True)
    assert "data as of 20" in after and "no rollup yet" not in after


def test_the_overview_links_only_to_pages_the_user_may_open(client, as_role):
    as_role("viewer")
    html = client.get("/").get_data(as_text=True)
    hrefs = {h.split('"', 1)[0] for h in html.split('href="')[1:]}
    for href in hrefs:
        if href.startswith("/") and not href.startswith(("/static/", "/favicon")):
            assert client.get(href).status_code in (200, 302), href
