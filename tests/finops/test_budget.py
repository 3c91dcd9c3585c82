"""Budgets that hold: real-time Redis counters, concurrent reservations, alerts, resets."""
import asyncio
import json
import random
import threading
import time
from datetime import datetime, timezone
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import redis.asyncio as aioredis
import sqlalchemy as sa

from app.errors import Forbidden, ValidationError
from app.extensions import db
from app.finops import budget as rb
from app.finops import service
from app.finops.models import BudgetAlert
from app.ledger.models import LedgerEntry
from tests.factories import TenantFactory, UserFactory


@pytest.fixture()
def ns(app):
    return app.config["REDIS_NAMESPACE"]


def _hammer(redis_client, ns, tenant_id, estimate, max_actual, threads=8, period="2031-01"):
    """Threads reserve/settle until refused with nothing in flight (bounded)."""
    allowed = []

    def worker(seed):
        rnd = random.Random(seed)
        for _ in range(3000):
            ok, reason = rb.reserve(redis_client, ns, tenant_id, estimate, period=period)
            if not ok:
                if rb.state(redis_client, ns, tenant_id, period)["reserved_micro"] == 0:
                    return
                time.sleep(0.001)
                continue
            time.sleep(rnd.random() * 0.002)
            actual = Decimal(rnd.randint(1, int(max_actual * 10**6))) / 10**6
            rb.settle(redis_client, ns, tenant_id, estimate, actual, period=period)
            allowed.append(actual)

    ts = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in ts)
    return allowed, rb.state(redis_client, ns, tenant_id, period)


def test_hard_stop_holds_under_concurrent_load(redis_client, ns):
    tenant_id = 9001
    rb.mirror_limit(redis_client, ns, tenant_id, Decimal("2.00"), "hard_stop", "acme")
    allowed, st = _hammer(redis_client, ns, tenant_id, estimate=Decimal("0.05"), max_actual=0.05)
    limit = 2_000_000
    assert st["reserved_micro"] == 0
    assert st["spent_micro"] == sum(int(a * 10**6) for a in allowed)
    assert st["spent_micro"] <= limit                  # no overshoot at all
    assert limit - st["spent_micro"] < 50_000          # stopped within one request
    assert len(allowed) > 40


def test_underestimates_overshoot_only_by_what_was_in_flight(redis_client, ns):
    tenant_id = 9002
    rb.mirror_limit(redis_client, ns, tenant_id, Decimal("1.00"), "hard_stop", "acme")
    threads = 6
    _, st = _hammer(redis_client, ns, tenant_id, estimate=Decimal("0.01"), max_actual=0.05,
                    threads=threads)
    overshoot = st["spent_micro"] - 1_000_000
    assert overshoot <= threads * (50_000 - 10_000)
    assert not rb.reserve(redis_client, ns, tenant_id, Decimal("0.01"), period="2031-01")[0]


def test_refusal_message_alert_only_no_budget_and_a_new_month(redis_client, ns):
    tenant_id = 9003
    assert rb.reserve(redis_client, ns, tenant_id, 1, period="2031-02") == (True, "no_budget")
    rb.settle(redis_client, ns, tenant_id, 1, Decimal("0.75"), period="2031-02")
    rb.mirror_limit(redis_client, ns, tenant_id, Decimal("1"), "alert", "Legal Ops")
    assert rb.reserve(redis_client, ns, tenant_id, Decimal("0.5"), period="2031-02") == \
        (True, rb.OVER_ALERT_ONLY)
    rb.settle(redis_client, ns, tenant_id, Decimal("0.5"), Decimal("0.5"), period="2031-02")
    rb.mirror_limit(redis_client, ns, tenant_id, Decimal("1"), "hard_stop", "Legal Ops")
    ok, reason = rb.reserve(redis_client, ns, tenant_id, Decimal("0.001"), period="2031-02")
    assert not ok
    assert reason.startswith("Monthly budget of $1.00 for tenant Legal Ops is exhausted")
    assert "2031-03-01T00:00Z" in reason
    body = rb.error_body(reason)
    assert body["error"] == {"message": reason, "type": "insufficient_quota", "param": None,
                             "code": "budget_exceeded"}
    # The month is part of the key: March starts at zero without anything being reset.
    assert rb.reserve(redis_client, ns, tenant_id, Decimal("0.5"), period="2031-03") == (True, "ok")
    assert redis_client.ttl(rb.spent_key(ns, tenant_id, "2031-02")) > 0


def test_async_variants_share_the_counters(app, redis_client, ns):
    tenant_id = 9004
    rb.mirror_limit(redis_client, ns, tenant_id, Decimal("0.10"), "hard_stop", "t")

    async def run():
        client = aioredis.Redis.from_url(app.config["REDIS_URL"])
        try:
            results = await asyncio.gather(*[rb.areserve(client, ns, tenant_id, Decimal("0.03"),
                                                         period="2031-04") for _ in range(5)])
            granted = [r for r in results if r[0]]
            for _ in granted:
                await rb.asettle(client, ns, tenant_id, Decimal("0.03"), Decimal("0.03"),
                                 period="2031-04")
            return len(granted)
        finally:
            await client.aclose()
    assert asyncio.run(run()) == 3
    st = rb.state(redis_client, ns, tenant_id, "2031-04")
    assert st["spent_micro"] == 90_000 and st["reserved_micro"] == 0


def test_saving_a_budget_mirrors_it_and_is_scoped(app, redis_client, ns):
    mine, other = TenantFactory(name="sales"), TenantFactory(name="legal")
    lead = UserFactory(role="finops", tenant=mine)
    viewer = UserFactory(role="viewer")
    service.save_budget(lead, mine.id, "250", "hard_stop")
    st = rb.state(redis_client, ns, mine.id)
    assert st["limit_micro"] == 250_000_000 and st["action"] == "hard_stop"
    with pytest.raises(Forbidden):
        service.save_budget(lead, other.id, "100", "alert")
    with pytest.raises(Forbidden):
        service.save_budget(viewer, mine.id, "100", "alert")
    with pytest.raises(ValidationError) as exc:
        service.save_budget(lead, mine.id, "-3", "explode", "ftp://x")
    assert set(exc.value.errors) == {"monthly_limit_usd", "action", "webhook_url"}
    assert [b["tenant"] for b in service.list_budgets(lead)] == ["sales"]
    service.delete_budget(lead, mine.id)
    assert rb.state(redis_client, ns, mine.id)["limit_micro"] is None


class _Hook(BaseHTTPRequestHandler):
    received: list = []

    def do_POST(self):
        _Hook.received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_alerts_fire_once_per_threshold_and_post_the_webhook(app, redis_client, ns):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hook)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Hook.received = []
    try:
        tenant = TenantFactory(name="ops", department="Operations")
        admin = UserFactory(role="admin")
        url = f"http://127.0.0.1:{server.server_address[1]}/hook"
        service.save_budget(admin, tenant.id, "100", "alert", url)
        period = rb.current_period()
        rb.settle(redis_client, ns, tenant.id, 0, Decimal("85"), period=period)
        new = service.check_budget_alerts()
        assert sorted(a.threshold_pct for a in new) == [50, 80]
        assert service.check_budget_alerts() == []
        rb.settle(redis_client, ns, tenant.id, 0, Decimal("15"), period=period)
        assert [a.threshold_pct for a in service.check_budget_alerts()] == [100]
        rows = db.session.scalars(sa.select(BudgetAlert).order_by(BudgetAlert.threshold_pct)).all()
        assert [(r.threshold_pct, r.webhook_status) for r in rows] == \
            [(50, "204"), (80, "204"), (100, "204")]
        assert [h["threshold_pct"] for h in _Hook.received] == [50, 80, 100]
        assert _Hook.received[-1]["tenant"] == "ops" and _Hook.received[-1]["spent_usd"] == "100.00"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture()
def hook():
    """A real HTTP server receiving the budget webhooks."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hook)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Hook.received = []
    yield f"http://127.0.0.1:{server.server_address[1]}/hook"
    server.shutdown()
    server.server_close()


def test_a_hard_stop_refusal_raises_the_100_percent_alert(app, redis_client, ns, hook):
    """A hard stop refuses while spend is still under the limit, so spend alone never
    reaches 100%: the refusal itself raises the 100% alert and webhook, once."""
    tenant = TenantFactory(name="legal-ops", department="Legal")
    admin = UserFactory(role="finops")
    service.save_budget(admin, tenant.id, "1.00", "hard_stop", hook)
    period = rb.current_period()
    assert rb.reserve(redis_client, ns, tenant.id, Decimal("0.10"), period=period)[0]
    rb.settle(redis_client, ns, tenant.id, Decimal("0.10"), Decimal("0.85"), period=period)
    assert sorted(a.threshold_pct for a in service.check_budget_alerts()) == [50, 80]
    ok, reason = rb.reserve(redis_client, ns, tenant.id, Decimal("0.20"), period=period)
    assert not ok and "exhausted" in reason
    st = rb.state(redis_client, ns, tenant.id, period)
    assert st["spent_micro"] == 850_000 < st["limit_micro"]          # spend stayed under
    assert st["refused_micro"] == 1_050_000 and st["reserved_micro"] == 0
    assert [a.threshold_pct for a in service.check_budget_alerts()] == [100]
    assert [h["threshold_pct"] for h in _Hook.received] == [50, 80, 100]
    last = _Hook.received[-1]
    assert last["trigger"] == "refused" and last["spent_usd"] == "0.85"
    assert last["action"] == "hard_stop" and last["tenant"] == "legal-ops"
    assert [h["trigger"] for h in _Hook.received[:2]] == ["spend", "spend"]
    # later refusals do not alert again; the alert row records the webhook's answer
    assert not rb.reserve(redis_client, ns, tenant.id, Decimal("0.5"), period=period)[0]
    assert service.check_budget_alerts() == []
    row = db.session.scalar(sa.select(BudgetAlert).where(BudgetAlert.threshold_pct == 100))
    assert row.webhook_status == "204" and row.spent_usd == Decimal("0.85")


def test_an_alert_only_budget_is_not_at_100_percent_before_its_spend_is(app, redis_client,
                                                                          ns, hook):
    tenant = TenantFactory()
    service.save_budget(UserFactory(role="admin"), tenant.id, "1.00", "alert", hook)
    period = rb.current_period()
    rb.settle(redis_client, ns, tenant.id, 0, Decimal("0.85"), period=period)
    assert rb.reserve(redis_client, ns, tenant.id, Decimal("0.5"), period=period) == \
        (True, rb.OVER_ALERT_ONLY)
    assert sorted(a.threshold_pct for a in service.check_budget_alerts()) == [50, 80]
    assert rb.state(redis_client, ns, tenant.id, period)["refused_micro"] is None


def test_counters_reconcile_with_the_ledger(app, redis_client, ns):
    tenant = TenantFactory()
    admin = UserFactory(role="admin")
    service.save_budget(admin, tenant.id, "10", "hard_stop")
    now = datetime.now(timezone.utc)
    db.session.add_all([LedgerEntry(request_id=f"r{i}", at=now, tenant_id=tenant.id,
                                    cost_usd=Decimal("1.25")) for i in range(4)])
    db.session.commit()
    period = rb.current_period(now)
    assert rb.state(redis_client, ns, tenant.id, period)["spent_micro"] == 0  # Redis lost it
    out = service.reconcile_budget_counters(period)
    assert out == [{"tenant_id": tenant.id, "before_micro": 0, "after_micro": 5_000_000}]
    rb.settle(redis_client, ns, tenant.id, 0, Decimal("1"), period=period)  # not drained yet
    service.reconcile_budget_counters(period)
    assert rb.state(redis_client, ns, tenant.id, period)["spent_micro"] == 6_000_000
    service.reconcile_budget_counters(period, force=True)
    assert rb.state(redis_client, ns, tenant.id, period)["spent_micro"] == 5_000_000
    service.mirror_budgets()
    assert rb.state(redis_client, ns, tenant.id, period)["limit_micro"] == 10_000_000
