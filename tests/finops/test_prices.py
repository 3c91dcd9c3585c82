"""Effective-dated prices: FinOps admins schedule tier prices and GPU rates (console and
API, one service function, audited); the gateway's snapshot carries the schedule and
books each request at the price in force when it finishes."""
import json
from datetime import datetime, timedelta, timezone
from decimal import Decimal

import pytest
import sqlalchemy as sa

from app.audit.models import AuditLog
from app.core.pricing import book_cost, prices_at
from app.errors import Conflict, Forbidden, ValidationError
from app.extensions import db
from app.finops import prices
from app.finops.models import GpuRate, TierPrice
from app.contract.snapshot import Snapshot
from app.redis_client import get_redis, keys
from tests.factories import PoolFactory, TenantFactory, TierFactory, UserFactory
from tests.finops.conftest import api_token, csrf_of, login

NEW = {"price_input_per_m": "0.80", "price_cached_input_per_m": "0.20",
       "price_output_per_m": "2.40"}


def _published_snapshot() -> Snapshot:
    raw = get_redis().get(keys().snapshot_data())
    return Snapshot(json.loads(raw))


def test_a_scheduled_price_reaches_the_gateway_snapshot_and_applies_from_its_instant(app):
    tier = TierFactory(name="tier-1", rank=1)  # $1 / $0.25 / $3 per 1M
    frontier = TierFactory(name="tier-3", rank=3, price_input_per_m=Decimal("5"),
                           price_output_per_m=Decimal("15"))
    admin = UserFactory(role="finops")
    when = datetime.now(timezone.utc).replace(microsecond=0) + timedelta(days=2)
    row = prices.add_tier_price(admin, tier.id, {**NEW, "effective_from": when.isoformat()})
    prices.add_tier_price(admin, frontier.id, {"effective_from": "2099-01-01",
                                               "price_input_per_m": "4",
                                               "price_cached_input_per_m": "1",
                                               "price_output_per_m": "12"})
    assert row.effective_from == when
    audit = db.session.scalars(sa.select(AuditLog).where(
        AuditLog.action == "tier_price.create")).all()
    assert len(audit) == 2 and audit[0].actor_email == admin.email
    assert audit[0].after["effective_from"] == when.isoformat() and audit[0].after["tier"] == "tier-1"

    snap = _published_snapshot()  # what every gateway loads
    t1 = snap.tiers_by_name["tier-1"]
    assert [c["from_ts"] for c in t1["price_schedule"]] == [when.timestamp()]
    just_before, at = when - timedelta(microseconds=1), when
    assert Decimal(prices_at(t1, just_before)["price_output_per_m"]) == 3
    assert Decimal(prices_at(t1, at)["price_output_per_m"]) == Decimal("2.40")
    # the gateway's booking: 1000 in (400 cached), 200 out
    cost_old, base_old = book_cost(snap.all_tiers, t1, just_before, 1000, 400, 200)
    cost_new, base_new = book_cost(snap.all_tiers, t1, at, 1000, 400, 200)
    assert cost_old == Decimal("0.0013")          # 600x1 + 400x0.25 + 200x3
    assert cost_new == Decimal("0.00104")         # 600x0.8 + 400x0.2 + 200x2.4
    assert base_old == base_new == Decimal("0.008")  # frontier unchanged until 2099
    far = datetime(2099, 1, 1, tzinfo=timezone.utc)
    assert book_cost(snap.all_tiers, None, far, 1000, 400, 200) == (0, Decimal("0.0064"))


def test_price_changes_are_future_only_global_and_unique(app):
    tier = TierFactory()
    tenant = TenantFactory()
    soon = datetime.now(timezone.utc) + timedelta(hours=1)
    for role, scoped in (("finops", tenant), ("ops", None), ("viewer", None)):
        with pytest.raises(Forbidden):
            prices.add_tier_price(UserFactory(role=role, tenant=scoped), tier.id,
                                  {**NEW, "effective_from": soon.isoformat()})
    admin = UserFactory(role="admin")
    with pytest.raises(ValidationError) as exc:
        prices.add_tier_price(admin, tier.id, {"effective_from": "2020-01-01",
                                               "price_input_per_m": "-1",
                                               "price_cached_input_per_m": "x"})
    assert set(exc.value.errors) == {"effective_from", "price_input_per_m",
                                     "price_cached_input_per_m", "price_output_per_m"}
    with pytest.raises(ValidationError) as exc:  # inside the reload lead time
        prices.add_tier_price(admin, tier.id, {**NEW, "effective_from":
                                               (datetime.now(timezone.utc)
                                                + timedelta(seconds=5)).isoformat()})
    assert "effective_from" in exc.value.errors
    prices.add_tier_price(admin, tier.id, {**NEW, "effective_from": soon.isoformat()})
    with pytest.raises(Conflict):
        prices.add_tier_price(admin, tier.id, {**NEW, "effective_from": soon.isoformat()})
    assert db.session.scalar(sa.select(sa.func.count(TierPrice.id))) == 1


def test_gpu_rates_default_to_now_and_refuse_the_past(app):
    admin = UserFactory(role="finops")
    now = datetime(2027, 3, 1, 12, tzinfo=timezone.utc)
    first = prices.add_gpu_rate(admin, {"gpu_type": "H100", "hourly_usd": "2.49"}, now=now)
    assert first.effective_from == now and first.hourly_usd == Decimal("2.49")
    with pytest.raises(ValidationError) as exc:
        prices.add_gpu_rate(admin, {"gpu_type": "H 100!", "hourly_usd": "-2",
                                    "effective_from": "2027-02-01"}, now=now)
    assert set(exc.value.errors) == {"gpu_type", "hourly_usd", "effective_from"}
    with pytest.raises(Forbidden):
        prices.add_gpu_rate(UserFactory(role="finops", tenant=TenantFactory()),
                            {"gpu_type": "L40S", "hourly_usd": "1"}, now=now)
    prices.add_gpu_rate(admin, {"gpu_type": "H100", "hourly_usd": "2.10",
                                "effective_from": "2027-04-01T00:00"}, now=now)
    PoolFactory(gpu_type="H100")
    book = prices.price_book(now=datetime(2027, 3, 15, tzinfo=timezone.utc))
    h100 = next(g for g in book["gpus"] if g["gpu_type"] == "H100")
    assert h100["now"] == Decimal("2.49") and len(h100["schedule"]) == 2 and h100["pools"]
    later = prices.price_book(now=datetime(2027, 4, 2, tzinfo=timezone.utc))
    assert next(g for g in later["gpus"] if g["gpu_type"] == "H100")["now"] == Decimal("2.10")
    assert db.session.scalar(sa.select(sa.func.count(AuditLog.id)).where(
        AuditLog.action == "gpu_rate.create")) == 2


def test_console_and_api_schedule_prices_with_the_same_rules(app, client):
    tier = TierFactory(name="tier-x")
    admin = UserFactory(role="finops")
    login(client, admin)
    page = client.get("/finops/prices")
    assert page.status_code == 200 and "tier-x" in page.get_data(as_text=True)
    when = (datetime.now(timezone.utc) + timedelta(days=3)).strftime("%Y-%m-%dT%H:%M")
    form = {"csrf_token": csrf_of(page.get_data(as_text=True)), "kind": "tier",
            "tier_id": str(tier.id), "effective_from": when, **NEW}
    resp = client.post("/finops/prices", data=form)
    assert resp.status_code == 302
    after = client.get("/finops/prices").get_data(as_text=True)
    assert "scheduled" in after and "2.40" in after
    bad = client.post("/finops/prices", data={**form, "effective_from": "2001-01-01"})
    assert bad.status_code == 422 and "booked costs are never re-priced" in \
        bad.get_data(as_text=True)
    gpu = client.post("/finops/prices", data={"csrf_token": form["csrf_token"], "kind": "gpu",
                                              "gpu_type": "L40S", "hourly_usd": "0.99"})
    assert gpu.status_code == 302
    assert db.session.scalar(sa.select(GpuRate.hourly_usd)) == Decimal("0.99")

    headers = {"Authorization": f"Bearer {api_token(admin)}"}
    api = client.post(f"/api/v1/finops/tiers/{tier.id}/prices", headers=headers,
                      json={**NEW, "effective_from": "2099-06-01T00:00Z"})
    assert api.status_code == 201, api.get_json()
    assert api.get_json()["effective_from"] == "2099-06-01T00:00:00+00:00"
    assert client.post("/api/v1/finops/gpu-rates", headers=headers,
                       json={"gpu_type": "H100", "hourly_usd": "2.5"}).status_code == 201
    listed = client.get("/api/v1/finops/prices", headers=headers).get_json()
    tx = next(t for t in listed["tiers"] if t["name"] == "tier-x")
    assert len(tx["schedule"]) == 3  # own price + two changes
    assert {g["gpu_type"] for g in listed["gpus"]} == {"L40S", "H100"}
    past = client.post(f"/api/v1/finops/tiers/{tier.id}/prices", headers=headers,
                       json={**NEW, "effective_from": "2001-01-01"})
    assert past.status_code == 422 and "effective_from" in past.get_json()["error"]["fields"]
    lead = UserFactory(role="finops", tenant=TenantFactory())
    denied = client.post("/api/v1/finops/gpu-rates",
                         headers={"Authorization": f"Bearer {api_token(lead)}"},
                         json={"gpu_type": "H100", "hourly_usd": "1"})
    assert denied.status_code == 403
    assert db.session.scalar(sa.select(sa.func.count(TierPrice.id))) == 2
