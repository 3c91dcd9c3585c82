"""Rollups: built from the ledger, idempotent, rebuildable, checked against the ledger;
corrections are adjustment rows; GPU-hours allocated by token share."""
from datetime import datetime, timedelta, timezone
from decimal import Decimal

import pytest
import sqlalchemy as sa

from app.audit.models import AuditLog
from app.catalog.models import Pool, Replica, ReplicaMetric, Tier
from app.errors import Forbidden, ValidationError
from app.extensions import db
from app.finops import rollups, service
from app.finops.models import GpuRate, Rollup
from app.ledger.models import LedgerEntry
from tests.factories import TenantFactory, UserFactory

COLS = ("grain", "bucket_start", "tenant_id", "department", "tier", "workflow", "model",
        "requests", "cache_exact", "cache_semantic", "prompt_tokens", "cached_tokens",
        "completion_tokens", "raw_schema_output_tokens", "cost_usd", "baseline_cost_usd",
        "ttft_count", "ttft_b05", "ttft_b10", "cache_saved_usd", "gpu_cost_usd")


def snapshot():
    rows = db.session.execute(sa.select(*[getattr(Rollup, c) for c in COLS])).all()
    return sorted(tuple(str(v) for v in r) for r in rows)


def test_rebuild_twice_gives_the_same_rollups_and_they_match_the_ledger(month):
    rollups.rebuild_all()
    first = snapshot()
    assert first and rollups.reconcile(month["period"]) == []
    rollups.rebuild_all()
    assert snapshot() == first
    db.session.execute(sa.delete(Rollup))
    db.session.commit()
    rollups.rebuild_all()
    assert snapshot() == first
    grains = dict(db.session.execute(sa.select(Rollup.grain, sa.func.count()).group_by(Rollup.grain)).all())
    assert grains["month"] < grains["day"] < grains["hour"]


def test_reconcile_reports_a_ledger_row_the_rollups_have_not_seen(month):
    rollups.rebuild_all()
    late = LedgerEntry(request_id="late-1", at=datetime(2026, 10, 3, 4, 5, tzinfo=timezone.utc),
                       tenant_id=month["tenants"][0].id, tier="tier-1", workflow="w", model="m",
                       prompt_tokens=100, completion_tokens=10, cost_usd=Decimal("1.2345"),
                       baseline_cost_usd=Decimal("2"))
    db.session.add(late)
    db.session.commit()
    diffs = rollups.reconcile(month["period"])
    fields = {(d["grain"], d["field"]) for d in diffs}
    assert ("hour", "cost_usd") in fields and ("month", "cost_usd") in fields
    cost = [d for d in diffs if d["field"] == "cost_usd" and d["grain"] == "day"][0]
    assert cost["difference"] == Decimal("-1.2345")
    # The beat task rebuilds what new rows touched, whatever their timestamp.
    mark, _ = rollups.rebuild_new(late.id - 1)
    assert mark == late.id
    assert rollups.reconcile(month["period"]) == []


def test_run_rollups_follows_the_watermark(app, month):
    assert service.run_rollups()
    assert rollups.reconcile(month["period"]) == []
    assert service.run_rollups()  # the recent window is always refreshed; nothing new
    assert rollups.reconcile(month["period"]) == []


def test_adjustments_are_new_audited_ledger_rows_never_edits(app, month):
    tenant = month["tenants"][0]
    finops = UserFactory(role="finops")
    lead = UserFactory(role="finops", tenant=month["tenants"][1])
    before = db.session.scalar(sa.select(sa.func.count()).select_from(LedgerEntry))
    row = service.record_adjustment(finops, tenant.id, "-12.50", "refund for outage")
    assert row.kind == "adjustment" and row.cost_usd == Decimal("-12.5")
    assert db.session.scalar(sa.select(sa.func.count()).select_from(LedgerEntry)) == before + 1
    audit = db.session.scalars(sa.select(AuditLog).where(AuditLog.action == "ledger.adjust")).one()
    assert audit.tenant_id == tenant.id and audit.after["reason"] == "refund for outage"
    with pytest.raises(Forbidden):
        service.record_adjustment(lead, tenant.id, "5", "not theirs")
    with pytest.raises(ValidationError):
        service.record_adjustment(finops, tenant.id, "abc", "x")
    with pytest.raises(ValidationError):
        service.record_adjustment(finops, tenant.id, "3", " ")
    now = datetime.now(timezone.utc)
    rollups.rebuild(now - timedelta(hours=1), now + timedelta(minutes=1))
    adj = db.session.scalar(sa.select(sa.func.sum(Rollup.adjustment_usd)).where(
        Rollup.grain == "month", Rollup.tenant_id == tenant.id))
    assert adj == Decimal("-12.5")
    req = db.session.scalar(sa.select(sa.func.sum(Rollup.requests)).where(
        Rollup.grain == "hour", Rollup.bucket_start >= rollups.floor_bucket(now, "hour")))
    assert req == 0  # an adjustment is not a request


def test_gpu_hours_are_allocated_to_the_pool_requests_by_token_share(app):
    tenant_a, tenant_b = TenantFactory(), TenantFactory()
    pool = Pool(name="h100-pool", model="qwen", gpu_type="H100", gpus_per_replica=2,
                desired_replicas=1)
    db.session.add(pool)
    db.session.flush()
    db.session.add(Tier(name="self-hosted", rank=1, model="qwen", upstream_kind="pool",
                        pool_id=pool.id))
    reps = [Replica(pool_id=pool.id, index=i) for i in range(3)]
    db.session.add_all(reps)
    db.session.add(GpuRate(gpu_type="H100", hourly_usd=Decimal("2.5"),
                           effective_from=datetime(2026, 1, 1, tzinfo=timezone.utc)))
    db.session.flush()
    h = datetime(2026, 11, 2, 10, tzinfo=timezone.utc)
    for r in reps:  # 3 replicas up in hour 10; only one in hour 11 (idle)
        db.session.add(ReplicaMetric(replica_id=r.id, at=h + timedelta(minutes=5)))
    db.session.add(ReplicaMetric(replica_id=reps[0].id, at=h + timedelta(hours=1, minutes=5)))

    def entry(i, tenant, prompt, out, cache="miss"):
        return LedgerEntry(request_id=f"g{i}", at=h + timedelta(minutes=i), tenant_id=tenant.id,
                           tier="self-hosted" if cache == "miss" else "", workflow="w",
                           model="qwen", cache=cache, prompt_tokens=prompt,
                           completion_tokens=out, baseline_cost_usd=Decimal("0.5"))
    db.session.add_all([entry(1, tenant_a, 900, 100), entry(2, tenant_b, 2500, 500),
                        entry(3, tenant_b, 5000, 100, cache="exact")])
    db.session.commit()
    rollups.rebuild(h, h + timedelta(hours=2))
    gpu = dict(db.session.execute(sa.select(Rollup.tenant_id, Rollup.gpu_cost_usd).where(
        Rollup.grain == "hour", Rollup.bucket_start == h, Rollup.tier == "self-hosted")).all())
    # 3 replicas x 2 GPUs x $2.50 = $15 for hour 10, split 1000 : 3000 tokens
    assert gpu == {tenant_a.id: Decimal("3.75"), tenant_b.id: Decimal("11.25")}
    idle = db.session.scalars(sa.select(Rollup).where(Rollup.workflow == rollups.IDLE_WORKFLOW,
                                                      Rollup.grain == "hour")).one()
    assert idle.bucket_start == h + timedelta(hours=1) and idle.gpu_cost_usd == Decimal("5")
    saved = db.session.scalar(sa.select(Rollup.cache_saved_usd).where(
        Rollup.grain == "hour", Rollup.tenant_id == tenant_b.id, Rollup.tier == ""))
    assert saved == Decimal("0.5")  # the cache hit cost 0 and saved its baseline
    month_gpu = db.session.scalar(sa.select(sa.func.sum(Rollup.gpu_cost_usd)).where(
        Rollup.grain == "month"))
    assert month_gpu == Decimal("20")


def test_a_pool_is_charged_its_gpu_hours_once_not_plus_its_token_estimates(app):
    """Pool requests are booked at the pool tier's per-token price (an estimate); the
    month's reports charge the pool exactly GPU-hours x rate, to the cent, with the
    estimates replaced, while the external tier stays priced per token."""
    from app.core.costing import cents
    from app.core.pricing import book_cost
    from app.finops import reports
    from app.contract.snapshot import Snapshot
    from app.snapshot.service import build_snapshot

    tenant_a, tenant_b = TenantFactory(), TenantFactory()
    pool = Pool(name="l40s-pool", model="qwen", gpu_type="L40S", gpus_per_replica=2,
                desired_replicas=2)
    db.session.add(pool)
    db.session.flush()
    db.session.add_all([
        Tier(name="pool-tier", rank=1, model="qwen", upstream_kind="pool", pool_id=pool.id,
             price_input_per_m=Decimal("0.35"), price_cached_input_per_m=Decimal("0.0875"),
             price_output_per_m=Decimal("0.35")),
        Tier(name="frontier", rank=3, model="gpt", upstream_kind="external",
             price_input_per_m=Decimal("3.5"), price_cached_input_per_m=Decimal("0.875"),
             price_output_per_m=Decimal("10.5"))])
    reps = [Replica(pool_id=pool.id, index=i) for i in range(2)]
    db.session.add_all(reps)
    db.session.add(GpuRate(gpu_type="L40S", hourly_usd=Decimal("1.337"),
                           effective_from=datetime(2026, 1, 1, tzinfo=timezone.utc)))
    db.session.flush()
    day = datetime(2026, 9, 14, tzinfo=timezone.utc)
    up_hours = 7  # both replicas report metrics in hours 0..6; requests in hours 0, 1, 4
    for hour in range(up_hours):
        for r in reps:
            db.session.add(ReplicaMetric(replica_id=r.id, at=day + timedelta(hours=hour,
                                                                               minutes=3)))
    db.session.commit()
    snap = Snapshot(build_snapshot())
    rows, i = [], 0
    for hour, tenant, tier, prompt, out in ((0, tenant_a, "pool-tier", 1200, 300),
                                            (0, tenant_b, "pool-tier", 800, 100),
                                            (1, tenant_a, "pool-tier", 5000, 700),
                                            (1, tenant_b, "frontier", 3000, 400),
                                            (4, tenant_b, "pool-tier", 2222, 333),
                                            (4, tenant_a, "frontier", 1000, 50)):
        at = day + timedelta(hours=hour, minutes=10 + i)
        cost, base = book_cost(snap.all_tiers, snap.tiers_by_name[tier], at, prompt, 0, out)
        rows.append(LedgerEntry(request_id=f"p{i}", at=at, tenant_id=tenant.id, tier=tier,
                                workflow="w", model="m", prompt_tokens=prompt,
                                completion_tokens=out, cost_usd=cost, baseline_cost_usd=base))
        i += 1
    db.session.add_all(rows)
    db.session.commit()
    estimates = sum(r.cost_usd for r in rows if r.tier == "pool-tier")
    external = sum(r.cost_usd for r in rows if r.tier == "frontier")
    assert estimates > 0 and external > 0

    rollups.rebuild(day, day + timedelta(days=1))
    assert rollups.reconcile("2026-09") == []
    gpu_hours = up_hours * len(reps) * pool.gpus_per_replica
    pool_month = Decimal(gpu_hours) * Decimal("1.337")  # 28 GPU-hours = $37.436
    month_rows = db.session.scalars(sa.select(Rollup).where(Rollup.grain == "month")).all()
    pool_rows = [r for r in month_rows if r.tier == "pool-tier"]
    assert sum(r.gpu_cost_usd for r in pool_rows) == pool_month          # exact
    assert sum(r.pool_estimate_usd for r in pool_rows) == estimates       # all replaced
    assert sum(r.cost_usd for r in month_rows) == estimates + external    # = the ledger

    admin = UserFactory(role="finops")
    period = reports.parse_period("2026-09")
    show = reports.showback(admin, period)
    assert cents(show["total"]["cost"]) == cents(pool_month + external)  # not + estimates
    assert show["total"]["gpu_cost_shown"] == Decimal("37.436000")   # to the micro-dollar
    assert show["total"]["token_cost"] == external
    assert sum(r["cost_shown"] for r in show["rows"]) == show["total"]["cost_shown"]
    idle = next(r for r in show["rows"] if r["tenant_id"] == 0)  # hours 2, 3, 5, 6
    assert idle["gpu_cost"] == 4 * len(reps) * pool.gpus_per_replica * Decimal("1.337")
    dash = reports.dashboard(admin, period)
    assert dash["totals"]["cost"] == pool_month + external
    # a tenant's own view: its share of the allocated hours plus its external tokens
    lead_a = UserFactory(role="viewer", tenant=tenant_a)
    mine = reports.showback(lead_a, period)["total"]
    assert mine["token_cost"] == sum(r.cost_usd for r in rows
                                     if r.tier == "frontier" and r.tenant_id == tenant_a.id)
    assert 0 < mine["gpu_cost"] < pool_month
