"""Ledger rollups: hour buckets from the ledger, days from hours, months from days.

A rebuild of a range deletes and re-inserts its buckets in one transaction (under an
advisory lock on PostgreSQL), so running it twice gives the same rows and the rollups
can always be rebuilt from the ledger. Token columns count tokens a model served (cache
hits generated none); cache hits are counted and their baseline kept as ``cache_saved_usd``.

Self-hosted pools are charged once, by GPU-hours. The gateway books a pool request at
its tier's per-token price: an estimate, so real-time budgets see spend at once. When
an hour is rolled up and its pool has a GPU rate, ``allocate_gpu_hours`` splits the
pool's hour cost (replicas up x GPUs per replica x hourly rate) over that hour's pool
rows by token share into ``gpu_cost_usd`` and moves their booked estimate into
``pool_estimate_usd``; reports charge ``cost_usd - pool_estimate_usd + gpu_cost_usd``.
So a pool's cost for a month is exactly its GPU-hours x rate (idle hours included, as
tenant 0), never that plus its token estimates. Without a rate for its GPU type the
estimate stays the charge. ``cost_usd`` itself always equals the ledger's sum.

Savings per stage (``saved_<stage>_usd``, app.core.pricing.stage_savings) are summed
from request rows only, at token prices; the GPU-hour true-up is not spread over them.

Off-path rows (``OFF_PATH_KINDS``: ``shadow``, an adapter's shadow or tier-1 exploration,
``app.gateway.shadow``; ``cache_verify``, a sampled cache hit generated again,
``app.gateway.cache_verify``) are no tenant's spend: rollups, and so every report and budget
built on them, leave them out, and so does the reconcile's ledger side.
"""
from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import sqlalchemy as sa

from app.catalog.models import Pool, Replica, ReplicaMetric, Tier
from app.core import costing
from app.extensions import db
from app.finops.histogram import N_BUCKETS, TTFT_BOUNDS
from app.finops.models import TTFT_BUCKET_COLUMNS, GpuRate, Rollup
from app.ledger.models import OFF_PATH_KINDS, SAVED_COLUMNS, LedgerEntry
from app.tenants.models import Tenant

IDLE_WORKFLOW = "(idle)"
_LOCK_KEY = 91_0009  # pg_advisory_xact_lock key for rollup rebuilds
_SUM_COLUMNS = ("requests", "cache_exact", "cache_semantic", "escalations", "prompt_tokens",
                "cached_tokens", "completion_tokens", "raw_schema_output_tokens", "cost_usd",
                "gpu_cost_usd", "baseline_cost_usd", "ttft_ms_sum", "ttft_count",
                "cache_saved_usd", "adjustment_usd", "pool_estimate_usd", *SAVED_COLUMNS,
                *TTFT_BUCKET_COLUMNS)
_DIMS = ("tenant_id", "department", "tier", "workflow", "model")


# --- bucket arithmetic ----------------------------------------------------------------

def floor_bucket(at: datetime, grain: str) -> datetime:
    at = at.astimezone(timezone.utc)
    if grain == "hour":
        return at.replace(minute=0, second=0, microsecond=0)
    if grain == "day":
        return at.replace(hour=0, minute=0, second=0, microsecond=0)
    return at.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def next_bucket(at: datetime, grain: str) -> datetime:
    if grain == "hour":
        return at + timedelta(hours=1)
    if grain == "day":
        return at + timedelta(days=1)
    return (at.replace(day=28) + timedelta(days=4)).replace(day=1)


def ceil_bucket(at: datetime, grain: str) -> datetime:
    start = floor_bucket(at, grain)
    return start if start == at else next_bucket(start, grain)


def month_range(period: str) -> tuple[datetime, datetime]:
    """'YYYY-MM' -> [first instant, first instant of the next month)."""
    start = datetime.strptime(period, "%Y-%m").replace(tzinfo=timezone.utc)
    return start, next_bucket(start, "month")


def _trunc(col, grain: str):
    if db.session.get_bind().dialect.name == "postgresql":
        # Literals, not bound parameters: the same expression must match in GROUP BY.
        return sa.func.date_trunc(sa.literal_column(f"'{grain}'"), col,
                                  sa.literal_column("'UTC'"))
    fmt = {"hour": "%Y-%m-%d %H:00:00.000000", "day": "%Y-%m-%d 00:00:00.000000",
           "month": "%Y-%m-01 00:00:00.000000"}[grain]
    return sa.func.strftime(fmt, col)


# --- building -------------------------------------------------------------------------

def _hour_select(start: datetime, end: datetime):
    L = LedgerEntry
    served = L.cache == "miss"
    ttft = L.ttft_ms
    one = sa.literal(1)

    def count_if(cond):
        return sa.func.sum(sa.case((cond, one), else_=0))

    def sum_if(cond, value):
        return sa.func.coalesce(sa.func.sum(sa.case((cond, value), else_=0)), 0)

    raw_out = sa.func.coalesce(
        L.payload[("token_and_latency_telemetry",
                   "raw_schema_output_tokens_equivalent")].as_float(),
        L.completion_tokens)
    bounds = (0.0, *TTFT_BOUNDS)
    hist = []
    for i in range(N_BUCKETS):
        cond = ttft >= bounds[i] if i == N_BUCKETS - 1 else sa.and_(ttft >= bounds[i],
                                                                   ttft < TTFT_BOUNDS[i])
        hist.append(count_if(sa.and_(L.ttft_ms.is_not(None), cond)))
    bucket = _trunc(L.at, "hour")
    department = sa.func.coalesce(Tenant.department, sa.literal_column("''"))
    is_request = L.kind == "request"
    return (sa.select(
        sa.literal("hour"), bucket, L.tenant_id, department, L.tier, L.workflow, L.model,
        count_if(is_request), count_if(L.cache == "exact"), count_if(L.cache == "semantic"),
        count_if(L.escalated.is_(True)),
        sum_if(served, L.prompt_tokens), sum_if(served, L.cached_tokens),
        sum_if(served, L.completion_tokens), sa.cast(sa.func.round(sum_if(sa.and_(served, is_request), raw_out)), sa.BigInteger),
        sa.func.coalesce(sa.func.sum(L.cost_usd), 0), sa.literal(0),
        sa.func.coalesce(sa.func.sum(L.baseline_cost_usd), 0),
        sa.func.coalesce(sa.func.sum(ttft), 0.0), sa.func.count(ttft),
        sum_if(sa.and_(is_request, L.cache != "miss"), L.baseline_cost_usd),
        sum_if(L.kind == "adjustment", L.cost_usd), sa.literal(0),
        *[sum_if(is_request, getattr(L, c)) for c in SAVED_COLUMNS], *hist)
        .select_from(L).outerjoin(Tenant, Tenant.id == L.tenant_id)
        .where(L.at >= start, L.at < end, L.kind.not_in(OFF_PATH_KINDS))
        .group_by(bucket, L.tenant_id, department, L.tier, L.workflow, L.model))


def _coarser_select(grain: str, source: str, start: datetime, end: datetime):
    R = Rollup
    bucket = _trunc(R.bucket_start, grain)
    sums = [sa.func.sum(getattr(R, c)) for c in _SUM_COLUMNS]
    return (sa.select(sa.literal(grain), bucket, *[getattr(R, d) for d in _DIMS], *sums)
            .where(R.grain == source, R.bucket_start >= start, R.bucket_start < end)
            .group_by(bucket, *[getattr(R, d) for d in _DIMS]))


_INSERT_COLUMNS = ("grain", "bucket_start", *_DIMS, *_SUM_COLUMNS)


def _replace(grain: str, start: datetime, end: datetime, select) -> str:
    db.session.execute(sa.delete(Rollup).where(Rollup.grain == grain,
                                               Rollup.bucket_start >= start,
                                               Rollup.bucket_start < end))
    db.session.execute(sa.insert(Rollup).from_select(list(_INSERT_COLUMNS), select))
    return f"{start.isoformat()}/{end.isoformat()}"


def rebuild(start: datetime, end: datetime, *, commit: bool = True) -> dict[str, str]:
    """Rebuild every hour bucket touching [start, end) from the ledger (with GPU-hour
    allocation), then the days and months that contain them. Returns the range rebuilt
    per grain (and the idle GPU rows added)."""
    if db.session.get_bind().dialect.name == "postgresql":
        db.session.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": _LOCK_KEY})
    h0, h1 = floor_bucket(start, "hour"), ceil_bucket(end, "hour")
    d0, d1 = floor_bucket(start, "day"), ceil_bucket(end, "day")
    m0, m1 = floor_bucket(start, "month"), ceil_bucket(end, "month")
    counts = {"hour": _replace("hour", h0, h1, _hour_select(h0, h1))}
    counts["idle_gpu_rows"] = str(allocate_gpu_hours(h0, h1))
    counts["day"] = _replace("day", d0, d1, _coarser_select("day", "hour", d0, d1))
    counts["month"] = _replace("month", m0, m1, _coarser_select("month", "day", m0, m1))
    if commit:
        db.session.commit()
    return counts


def rebuild_all(*, commit: bool = True) -> dict[str, str]:
    lo, hi = db.session.execute(sa.select(sa.func.min(LedgerEntry.at),
                                          sa.func.max(LedgerEntry.at))).one()
    if lo is None:
        return {}
    return rebuild(lo, hi + timedelta(microseconds=1), commit=commit)


def rebuild_new(watermark_id: int, since: datetime | None = None
                ) -> tuple[int, dict[str, str]]:
    """Rebuild the buckets touched by ledger rows with id > ``watermark_id`` (late rows
    included, whatever their timestamp) and everything from ``since`` on (ids commit out
    of order under concurrent drains; a recent window catches those). Returns the new
    watermark and row counts."""
    lo, hi, top = db.session.execute(
        sa.select(sa.func.min(LedgerEntry.at), sa.func.max(LedgerEntry.at),
                  sa.func.max(LedgerEntry.id)).where(LedgerEntry.id > watermark_id)).one()
    if top is None and since is None:
        return watermark_id, {}
    now = datetime.now(timezone.utc)
    start = min(x for x in (lo, since) if x is not None)
    end = max(x for x in (hi, now if since else None) if x is not None)
    counts = rebuild(start, end + timedelta(microseconds=1))
    return (int(top) if top is not None else watermark_id), counts


# --- GPU-hours --------------------------------------------------------------------------

def _load_rates() -> list[costing.GpuRate]:
    return [costing.GpuRate(r.gpu_type, r.hourly_usd, r.effective_from)
            for r in db.session.scalars(sa.select(GpuRate))]


def allocate_gpu_hours(start: datetime, end: datetime) -> int:
    """Price self-hosted pool hours in [start, end) and split them over the hour rows of
    the tiers the pool serves by token share, replacing those rows' per-token estimate
    (see the module docstring). An hour with replicas up but no requests becomes an idle
    row (tenant 0). Returns how many idle rows were added."""
    pools = {p.id: p for p in db.session.scalars(sa.select(Pool).where(Pool.gpu_type != ""))}
    if not pools:
        return 0
    rates = _load_rates()
    tiers = db.session.execute(sa.select(Tier.name, Tier.pool_id, Tier.model).where(
        Tier.upstream_kind == "pool", Tier.pool_id.in_(list(pools)))).all()
    if not tiers or not rates:
        return 0
    pool_of_tier = {name: pool_id for name, pool_id, _ in tiers}
    model_of_pool = {pool_id: model for _, pool_id, model in tiers}
    tier_of_pool = {pool_id: name for name, pool_id, _ in tiers}
    hour = _trunc(ReplicaMetric.at, "hour")
    up = defaultdict(int)
    for pool_id, bucket, n in db.session.execute(
            sa.select(Replica.pool_id, hour, sa.func.count(sa.distinct(ReplicaMetric.replica_id)))
            .join(Replica, Replica.id == ReplicaMetric.replica_id)
            .where(ReplicaMetric.at >= start, ReplicaMetric.at < end,
                   Replica.pool_id.in_(list(pools)))
            .group_by(Replica.pool_id, hour)):
        up[(pool_id, _as_utc(bucket))] = int(n)
    groups: dict[tuple[int, datetime], dict[int, int]] = defaultdict(dict)
    for rid, bucket, tier, tokens in db.session.execute(
            sa.select(Rollup.id, Rollup.bucket_start, Rollup.tier,
                      Rollup.prompt_tokens + Rollup.completion_tokens)
            .where(Rollup.grain == "hour", Rollup.bucket_start >= start,
                   Rollup.bucket_start < end, Rollup.tier.in_(list(pool_of_tier)))):
        groups[(pool_of_tier[tier], _as_utc(bucket))][rid] = int(tokens or 0)
    updates, idle = [], []
    for key in set(groups) | set(up):
        pool_id, bucket = key
        pool = pools[pool_id]
        rate = costing.gpu_rate_at(rates, pool.gpu_type, bucket)
        shares = groups.get(key, {})
        replicas = up.get(key) or (pool.desired_replicas if shares else 0)
        if rate is None or replicas == 0:
            continue
        cost = costing.pool_hour_cost(replicas, pool.gpus_per_replica, rate)
        if sum(shares.values()) == 0:
            idle.append({"grain": "hour", "bucket_start": bucket, "tenant_id": 0,
                         "department": "", "tier": tier_of_pool[pool_id],
                         "workflow": IDLE_WORKFLOW, "model": model_of_pool[pool_id],
                         "gpu_cost_usd": costing.to_ledger(cost)})
            continue
        for rid, part in costing.allocate_by_tokens(cost, shares).items():
            updates.append({"rid": rid, "gpu": part})
    if updates:  # the allocation replaces the per-token estimate booked for these rows
        table = Rollup.__table__
        db.session.execute(sa.update(table).where(table.c.id == sa.bindparam("rid"))
                           .values(gpu_cost_usd=sa.bindparam("gpu"),
                                   pool_estimate_usd=table.c.cost_usd), updates)
    if idle:
        db.session.execute(sa.insert(Rollup), idle)
    return len(idle)


def _as_utc(value: Any) -> datetime:
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    return value if value.tzinfo else value.replace(tzinfo=timezone.utc)


# --- checking ---------------------------------------------------------------------------

_CHECKED = {"requests": (sa.func.sum(sa.case((LedgerEntry.kind == "request", 1), else_=0)),
                         "requests"),
            "cost_usd": (sa.func.sum(LedgerEntry.cost_usd), "cost_usd"),
            "baseline_cost_usd": (sa.func.sum(LedgerEntry.baseline_cost_usd),
                                  "baseline_cost_usd"),
            **{c: (sa.func.sum(sa.case((LedgerEntry.kind == "request", getattr(LedgerEntry, c)),
                                       else_=0)), c) for c in SAVED_COLUMNS},
            "completion_tokens": (sa.func.sum(sa.case((LedgerEntry.cache == "miss",
                                                       LedgerEntry.completion_tokens),
                                                      else_=0)), "completion_tokens")}


def reconcile(period: str | tuple[datetime, datetime]) -> list[dict[str, Any]]:
    """Compare the rollups of every grain with the ledger over a month ('YYYY-MM') or
    [start, end) range of whole buckets, per tenant. Returns the differences (empty when
    they agree exactly)."""
    start, end = month_range(period) if isinstance(period, str) else period
    ledger: dict[int, dict[str, Decimal]] = {}
    stmt = (sa.select(LedgerEntry.tenant_id, *[expr for expr, _ in _CHECKED.values()])
            .where(LedgerEntry.at >= start, LedgerEntry.at < end,
                   LedgerEntry.kind.not_in(OFF_PATH_KINDS))
            .group_by(LedgerEntry.tenant_id))
    for row in db.session.execute(stmt):
        ledger[row[0]] = {name: Decimal(row[i + 1] or 0) for i, name in enumerate(_CHECKED)}
    out = []
    for grain in ("hour", "day", "month"):
        g0, g1 = ceil_bucket(start, grain), floor_bucket(end, grain)
        if (g0, g1) != (start, end):
            continue  # this grain's buckets don't tile the range
        got: dict[int, dict[str, Decimal]] = {}
        cols = [sa.func.sum(getattr(Rollup, col)) for _, col in _CHECKED.values()]
        for row in db.session.execute(
                sa.select(Rollup.tenant_id, *cols)
                .where(Rollup.grain == grain, Rollup.bucket_start >= start,
                       Rollup.bucket_start < end, Rollup.workflow != IDLE_WORKFLOW)
                .group_by(Rollup.tenant_id)):
            got[row[0]] = {name: Decimal(row[i + 1] or 0) for i, name in enumerate(_CHECKED)}
        for tenant_id in sorted(set(ledger) | set(got)):
            for field in _CHECKED:
                a = ledger.get(tenant_id, {}).get(field, Decimal(0))
                b = got.get(tenant_id, {}).get(field, Decimal(0))
                if a != b:
                    out.append({"grain": grain, "tenant_id": tenant_id, "field": field,
                                "ledger": a, "rollup": b, "difference": b - a})
    return out
