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
from app.contract import budget as rb
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
    with pytest.raises(Forbidden):   # a ceiling: the tenant's own finops cannot remove it
        service.delete_budget(lead, mine.id)
    service.delete_budget(UserFactory(role="finops"), mine.id)
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


def _event(tenant_id, rid, cost, at):
    return {"request_id": rid, "at": at.isoformat(), "tenant_id": tenant_id, "workflow": "",
            "workflow_name": "", "tier": "tier-3", "model": "m", "status": 200, "cache": "miss",
            "prompt_tokens": 10, "cached_tokens": 0, "completion_tokens": 5,
            "cost_usd": str(cost), "baseline_cost_usd": str(cost), "escalated": False,
            "ttft_ms": 3.0, "latency_ms": 9.0, "payload": {}}


def _push(redis_client, *events):
    import orjson

    from app.redis_client import keys
    redis_client.xadd(keys().ledger_stream(), {"b": orjson.dumps(list(events))})


def _book(redis_client, ns, tenant_id, rid, cost, period, now):
    """What a gateway does for a finished request: settle the hold at the actual cost
    (with the request id), then put the ledger event on the stream."""
    rb.settle(redis_client, ns, tenant_id, cost, cost, period=period, request_id=rid)
    _push(redis_client, _event(tenant_id, rid, cost, now))


def test_counters_reconcile_with_the_ledger_both_ways(app, redis_client, ns):
    from app.finops.models import Rollup
    from app.finops.rollups import floor_bucket
    from app.ledger.service import drain_stream
    tenant = TenantFactory()
    service.save_budget(UserFactory(role="admin"), tenant.id, "10", "hard_stop")
    now = datetime.now(timezone.utc)
    period = rb.current_period(now)

    def spent():
        return rb.state(redis_client, ns, tenant.id, period)["spent_micro"]

    def reconcile():
        (row,) = service.reconcile_budget_counters(period)
        assert row["tenant_id"] == tenant.id
        return row

    for i in range(4):
        _book(redis_client, ns, tenant.id, f"rc{tenant.id}-{i}", Decimal("1.25"), period, now)
    # counted, not drained yet: the reconcile knows and changes nothing
    assert reconcile() == {"tenant_id": tenant.id, "before_micro": 5_000_000,
                           "after_micro": 5_000_000, "undrained_micro": 5_000_000}
    drain_stream(max_batches=10)
    assert redis_client.hlen(rb.unbooked_key(ns, tenant.id)) == 0  # the drain forgot them
    assert reconcile()["after_micro"] == 5_000_000 == spent()
    # drift up (a double count) is corrected down, drift down (lost counts) up
    redis_client.incrby(rb.spent_key(ns, tenant.id, period), 2_000_000)
    assert reconcile() == {"tenant_id": tenant.id, "before_micro": 7_000_000,
                           "after_micro": 5_000_000, "undrained_micro": 0}
    redis_client.delete(rb.spent_key(ns, tenant.id, period))
    assert reconcile()["after_micro"] == 5_000_000
    # an event drained before its settle landed is not counted twice
    _push(redis_client, _event(tenant.id, "late-settle", Decimal("0.5"), now))
    drain_stream(max_batches=10)
    rb.settle(redis_client, ns, tenant.id, 0, Decimal("0.5"), period=period,
              request_id="late-settle")
    assert reconcile()["after_micro"] == 5_500_000
    assert redis_client.hlen(rb.unbooked_key(ns, tenant.id)) == 0
    # an in-flight reservation is left alone and still counts against the limit
    assert rb.reserve(redis_client, ns, tenant.id, Decimal("4.00"), period=period)[0]
    assert reconcile()["after_micro"] == 5_500_000
    assert rb.state(redis_client, ns, tenant.id, period)["reserved_micro"] == 4_000_000
    assert not rb.reserve(redis_client, ns, tenant.id, Decimal("0.60"), period=period)[0]
    rb.settle(redis_client, ns, tenant.id, Decimal("4.00"), 0, period=period)
    # a rolled-up pool hour: the GPU allocation replaces the booked per-token estimate
    db.session.add(Rollup(grain="hour", bucket_start=floor_bucket(now, "hour"),
                          tenant_id=tenant.id, tier="pool", workflow="w", model="m",
                          cost_usd=Decimal("0.25"), pool_estimate_usd=Decimal("0.25"),
                          gpu_cost_usd=Decimal("0.40")))
    db.session.commit()
    assert reconcile()["after_micro"] == 5_650_000
    # a count whose ledger event never arrives is dropped once it is old
    rb.settle(redis_client, ns, tenant.id, 0, Decimal("1"), period=period, request_id="lost")
    assert reconcile()["after_micro"] == 6_650_000
    assert rb.correct_spent(redis_client, ns, tenant.id, period, Decimal("5.65"),
                            max_age_s=-10) == (6_650_000, 5_650_000, 0)
    service.mirror_budgets()
    assert rb.state(redis_client, ns, tenant.id, period)["limit_micro"] == 10_000_000


def test_reconciling_while_gateways_book_and_the_drain_runs_changes_nothing(app, redis_client,
                                                                              ns):
    """No drift, lots of traffic: every reconcile, racing reservations, settles and
    drains, must leave the counter exactly where it was (a race would move it)."""
    from app.ledger.service import drain_stream
    tenant = TenantFactory()
    service.save_budget(UserFactory(role="admin"), tenant.id, "1000", "alert")
    tenant_id = tenant.id
    now = datetime.now(timezone.utc)
    period = rb.current_period(now)
    done = threading.Event()
    results, errors, actuals = [], [], []

    def gateway(seed):
        rnd = random.Random(seed)
        i = 0
        # 40 bookings each, and on until the reconciler has run 4 passes mid-traffic (on a
        # loaded machine 40 bookings can be over before it has)
        while i < 40 or (len(results) < 4 and i < 4000):
            i += 1
            est = Decimal("0.01")
            assert rb.reserve(redis_client, ns, tenant_id, est, period=period)[0]
            time.sleep(rnd.random() * 0.003)
            actual = Decimal(rnd.randint(1, 10_000)) / 10**6
            _book(redis_client, ns, tenant_id, f"race-{seed}-{i}", actual, period, now)
            actuals.append(actual)

    def in_app(fn):
        def run():
            with app.app_context():
                try:
                    fn()
                except Exception as exc:  # noqa: BLE001 - reported below
                    errors.append(exc)
                finally:
                    db.session.remove()
        return run

    def drainer():
        while not done.is_set():
            drain_stream(max_batches=2, batch_size=3)
        drain_stream(max_batches=100)

    def reconciler():
        while not done.is_set():
            results.extend(service.reconcile_budget_counters(period))

    gws = [threading.Thread(target=in_app(lambda s=s: gateway(s))) for s in range(6)]
    others = [threading.Thread(target=in_app(drainer)), threading.Thread(target=in_app(reconciler))]
    for t in gws + others:
        t.start()
    for t in gws:
        t.join(120)
    done.set()
    for t in others:
        t.join(120)
    assert not errors and not any(t.is_alive() for t in gws + others)
    assert len(results) > 3
    moved = [r for r in results if r["before_micro"] != r["after_micro"]]
    assert moved == []
    assert any(r["undrained_micro"] > 0 for r in results)  # it did run mid-traffic
    total = sum(int(a * 10**6) for a in actuals)
    (final,) = service.reconcile_budget_counters(period)
    ledger = db.session.scalar(sa.select(sa.func.sum(LedgerEntry.cost_usd)).where(
        LedgerEntry.tenant_id == tenant_id))
    assert final == {"tenant_id": tenant_id, "before_micro": total, "after_micro": total,
                     "undrained_micro": 0}
    assert int(ledger * 10**6) == total and len(actuals) >= 240
