"""FinOps at scale: 5M ledger rows in PostgreSQL (COPY), rollups, then the dashboard
query set, the monthly reports and the console page, timed over repeated runs.

    .venv/bin/python bench/finops.py [--rows 5000000] [--runs 30]

Creates a scratch database (dropped at the end) on SLUICE_BENCH_DATABASE_URL
(default: the local PostgreSQL used by the tests). Prints figures; asserts nothing
about time. Target: dashboard under 300 ms.
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import time
import uuid
from datetime import datetime, timezone
from decimal import Decimal
from pathlib import Path

import numpy as np
import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

BASE = os.environ.get("SLUICE_BENCH_DATABASE_URL",
                      "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
PERIOD = "2026-10"
TENANTS = 14  # the seed's 14 product squads
COPY_COLS = ("request_id", "kind", "at", "tenant_id", "workflow", "tier", "model", "status",
             "cache", "prompt_tokens", "cached_tokens", "completion_tokens", "cost_usd",
             "baseline_cost_usd", "escalated", "ttft_ms", "latency_ms", "payload")


def pctl(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(int(round(q * (len(xs) - 1))), len(xs) - 1)]


def timed(label: str, fn, runs: int) -> None:
    fn()  # warm
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    print(f"  {label:<44} p50 {statistics.median(times):8.1f} ms   p95 {pctl(times, 0.95):8.1f} ms"
          f"   (n={runs})", flush=True)


def seed(app):
    from app.auth.models import User
    from app.extensions import db
    from app.finops import simulate
    from app.finops.models import Budget
    from app.security import hash_password
    from app.tenants.models import Tenant
    from app.workflows.models import Workflow
    tiers = simulate.default_tiers(simulate.mid_month(PERIOD))
    simulate.add_catalog(tiers)  # three tiers; the frontier's price cut is a TierPrice row
    tenants = [Tenant(name=f"squad-{i:02d}", department=f"Squad {i:02d}") for i in range(TENANTS)]
    db.session.add_all(tenants)
    db.session.flush()
    wfs = []
    for t in tenants:
        for cat in simulate.COHORTS:
            for k in range(3):
                sig = f"{t.id:03d}-{cat}-{k}"
                db.session.add(Workflow(tenant_id=t.id, signature=sig, name=sig, category=cat))
                wfs.append((t.id, sig, cat))
    db.session.add(User(email="bench@example.com", password_hash=hash_password("Bench-pass-123"),
                        role="finops"))
    db.session.add_all([Budget(tenant_id=t.id, monthly_limit_usd=Decimal("50000"),
                               action="hard_stop") for t in tenants])
    db.session.commit()
    return tiers, wfs


def generate_chunk(rng, start: int, n: int, tiers, wfs, month_start: datetime, span_s: float):
    """COPY text for ``n`` rows shaped like app.finops.simulate (vectorised; costs are
    floats formatted to the ledger's 10 decimals)."""
    from app.finops.simulate import COHORTS
    cats = list(COHORTS)
    share = np.array([COHORTS[c].share for c in cats])
    cat_i = rng.choice(len(cats), size=n, p=share / share.sum())
    by_cat = {c: [w for w in wfs if w[2] == c] for c in cats}
    secs = np.sort(rng.random(n) * span_s)
    prompt_m = np.array([COHORTS[c].prompt for c in cats])[cat_i]
    comp_m = np.array([COHORTS[c].completion for c in cats])[cat_i]
    prompt = np.maximum((rng.lognormal(0, 0.5, n) * prompt_m).astype(int), 16)
    comp = np.maximum((rng.lognormal(0, 0.5, n) * comp_m).astype(int), 1)
    minify = np.array([COHORTS[c].minify for c in cats])[cat_i]
    raw = (comp / (1 - minify)).astype(int)
    sem = np.array([COHORTS[c].semantic_hit for c in cats])[cat_i]
    exact = np.array([COHORTS[c].exact_hit for c in cats])[cat_i]
    r = rng.random(n)
    cache = np.where(r < sem, 2, np.where(r < sem + exact, 1, 0))
    mix = np.array([COHORTS[c].tier_mix for c in cats])[cat_i]
    tier_i = (rng.random(n)[:, None] > np.cumsum(mix, axis=1)).sum(axis=1).clip(0, 2)
    hit = np.array([COHORTS[c].prefix_hit for c in cats])[cat_i]
    cached = np.minimum((prompt * np.clip(rng.normal(hit, 0.05), 0, 1)).astype(int), prompt)
    keys = ("price_input_per_m", "price_cached_input_per_m", "price_output_per_m")
    new = tiers[-1].prices["price_schedule"][0]
    change_s = (new["effective_from"] - month_start).total_seconds()
    after = secs >= change_s
    price = np.array([[float(t.prices[k]) for k in keys] for t in tiers])
    p = price[tier_i].copy()
    new_p = np.array([float(new[k]) for k in keys])
    p[(tier_i == 2) & after] = new_p
    cost = ((prompt - cached) * p[:, 0] + cached * p[:, 1] + comp * p[:, 2]) / 1e6
    fp = np.where(after[:, None], new_p[None, :], price[2][None, :])
    base = (prompt * fp[:, 0] + raw * fp[:, 2]) / 1e6
    miss = cache == 0
    cost = np.where(miss, cost, 0.0)
    cached = np.where(miss, cached, 0)
    ttft_m = np.array([COHORTS[c].ttft_ms for c in cats])[cat_i]
    ttft = np.where(miss, rng.lognormal(0, 0.25, n) * ttft_m * (1 + 0.6 * tier_i),
                    rng.uniform(2, 6, n))
    wf_pick = rng.random(n)
    tier_names = np.array([t.name for t in tiers])
    models = np.array([t.model for t in tiers])
    at = np.datetime64(month_start.replace(tzinfo=None), "us") + \
        (secs * 1e6).astype("timedelta64[us]")
    at_text = np.char.add(np.datetime_as_string(at, unit="us"), "+00")
    tier_col = np.where(miss, tier_names[tier_i], "")
    model_col = np.where(miss, models[tier_i], "")
    cache_col = np.array(["miss", "exact", "semantic"])[cache]
    pools = [by_cat[c] for c in cats]
    wf_j = (wf_pick * np.array([len(p) for p in pools])[cat_i]).astype(int)
    lines = []
    for j, (a, ci, wj, tc, mc, cc, pr, ca, co, c, b, tt, rw) in enumerate(zip(
            at_text.tolist(), cat_i.tolist(), wf_j.tolist(), tier_col.tolist(),
            model_col.tolist(), cache_col.tolist(), prompt.tolist(), cached.tolist(),
            comp.tolist(), cost.tolist(), base.tolist(), ttft.tolist(), raw.tolist())):
        tid, sig, _ = pools[ci][wj]
        lines.append(f"b-{start + j}\trequest\t{a}\t{tid}\t{sig}\t{tc}\t{mc}\t200\t{cc}\t"
                     f"{pr}\t{ca}\t{co}\t{c:.10f}\t{b:.10f}\tf\t{tt:.2f}\t"
                     f"{tt + co * 0.9:.2f}\t"
                     '{"token_and_latency_telemetry":{"raw_schema_output_tokens_equivalent":'
                     f"{rw}}}}}\n")
    return "".join(lines)


def load(app, n: int, tiers, wfs) -> None:
    from app.extensions import db
    from app.finops.rollups import month_range
    start, end = month_range(PERIOD)
    span = (end - start).total_seconds()
    rng = np.random.default_rng(42)
    engine = db.engine
    with engine.connect() as conn:
        idx = conn.execute(sa.text(
            "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'ledger_entries' "
            "AND indexname NOT LIKE '%pkey%' AND indexname NOT LIKE 'pk_%'")).all()
        for name, _ in idx:
            cons = conn.execute(sa.text("SELECT 1 FROM pg_constraint WHERE conname = :n"),
                                {"n": name}).first()
            conn.execute(sa.text(f'ALTER TABLE ledger_entries DROP CONSTRAINT "{name}"' if cons
                                 else f'DROP INDEX "{name}"'))
        conn.commit()
    t0 = time.perf_counter()
    raw = engine.raw_connection()
    try:
        cur = raw.driver_connection.cursor()
        chunk = 250_000
        with cur.copy(f"COPY ledger_entries ({', '.join(COPY_COLS)}) FROM STDIN") as copy:
            for s in range(0, n, chunk):
                copy.write(generate_chunk(rng, s, min(chunk, n - s), tiers, wfs, start, span))
        raw.driver_connection.commit()
    finally:
        raw.close()
    t1 = time.perf_counter()
    print(f"COPY {n:,} ledger rows: {t1 - t0:.1f} s ({n / (t1 - t0):,.0f} rows/s)", flush=True)
    with engine.connect() as conn:
        for _, ddl in idx:
            conn.execute(sa.text(ddl))
        conn.execute(sa.text("ANALYZE ledger_entries"))
        conn.commit()
    print(f"indexes rebuilt + ANALYZE: {time.perf_counter() - t1:.1f} s", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=5_000_000)
    ap.add_argument("--runs", type=int, default=30)
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    name = f"sluice_bench_finops_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(BASE, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(sa.text(f'CREATE DATABASE "{name}"'))
    url = re.sub(r"/[^/]*$", f"/{name}", BASE)
    ns = f"sluicebench{uuid.uuid4().hex[:8]}"
    try:
        run(url, ns, args)
    finally:
        with admin.connect() as c:
            c.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
        import redis
        r = redis.Redis.from_url(os.environ.get("SLUICE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0"))
        for key in r.scan_iter(f"{ns}:*", count=1000):
            r.delete(key)


def run(url: str, ns: str, args) -> None:
    from app.factory import create_app
    from app.auth.models import User
    from app.extensions import db
    from app.finops import reports, rollups
    app = create_app({"SQLALCHEMY_DATABASE_URI": url, "REDIS_NAMESPACE": ns,
                      "SECRET_KEY": "bench-secret-key-123456", "WTF_CSRF_ENABLED": False,
                      "SERVER_NAME": "localhost"}, env="test")
    with app.app_context():
        db.create_all()
        tiers, wfs = seed(app)
        load(app, args.rows, tiers, wfs)
        t0 = time.perf_counter()
        rollups.rebuild_all()
        t1 = time.perf_counter()
        counts = dict(db.session.execute(sa.select(
            rollups.Rollup.grain, sa.func.count()).group_by(rollups.Rollup.grain)).all())
        print(f"rollups from the ledger (hour, day, month): {t1 - t0:.1f} s, rows {counts}",
              flush=True)
        t2 = time.perf_counter()
        rollups.rebuild(datetime(2026, 10, 31, 22, tzinfo=timezone.utc),
                        datetime(2026, 11, 1, tzinfo=timezone.utc))
        print(f"incremental rebuild (last 2 hours + their day and month): "
              f"{time.perf_counter() - t2:.2f} s", flush=True)
        t3 = time.perf_counter()
        diffs = rollups.reconcile(PERIOD)
        print(f"reconcile {PERIOD} against the ledger: {time.perf_counter() - t3:.1f} s, "
              f"{len(diffs)} differences", flush=True)
        user = db.session.scalar(sa.select(User))
        month = reports.parse_period(PERIOD)
        week = reports.parse_period(start="2026-10-12", end="2026-10-18")
        day = reports.parse_period(start="2026-10-15", end="2026-10-15")
        tenant = db.session.scalar(sa.select(sa.func.min(rollups.Rollup.tenant_id)))
        d = reports.dashboard(user, month)
        t = d["totals"]
        print(f"month: {t['requests']:,} requests, baseline {d['headline']['baseline']} -> "
              f"actual {d['headline']['actual']}{d['headline']['per']} "
              f"({d['headline']['delta_pct']:+.1f}%), prefix {t['prefix_hit_pct']:.1f}%, "
              f"semantic {t['semantic_hit_pct']:.1f}%, TTFT p50/p95 {t['ttft_p50']:.1f}/"
              f"{t['ttft_p95']:.1f} ms", flush=True)
        print(f"timings over {args.rows:,} ledger rows:")
        timed("dashboard queries, month, all tenants", lambda: reports.dashboard(user, month),
              args.runs)
        timed("dashboard queries, month, one tenant",
              lambda: reports.dashboard(user, month, tenant), args.runs)
        timed("dashboard queries, one week (daily)", lambda: reports.dashboard(user, week),
              args.runs)
        timed("dashboard queries, one day (hourly)", lambda: reports.dashboard(user, day),
              args.runs)
        timed("cohort report, month", lambda: reports.cohorts(user, month), args.runs)
        timed("showback report, month", lambda: reports.showback(user, month), args.runs)
        timed("showback CSV rows, month",
              lambda: reports.report_rows(user, "showback", month), args.runs)
        client = app.test_client()
        client.post("/login", data={"email": "bench@example.com", "password": "Bench-pass-123"})

        def page(path):
            def go():
                resp = client.get(path)
                assert resp.status_code == 200, resp.status_code
            return go
        timed("GET /finops page (month), render included", page(f"/finops?period={PERIOD}"),
              args.runs)
        timed("GET /finops/cohorts page (month)", page(f"/finops/cohorts?period={PERIOD}"),
              args.runs)
        from app.finops import service
        t5 = time.perf_counter()
        rec = service.reconcile_budget_counters(PERIOD)
        print(f"  budget reconcile, {len(rec)} budgets, {PERIOD} (ledger sum + GPU true-up "
              f"under the booking lock): {(time.perf_counter() - t5) * 1000:.0f} ms", flush=True)
        t4 = time.perf_counter()
        resp = client.get("/finops/export/ledger.csv?start=2026-10-15&end=2026-10-15")
        size = len(resp.get_data())
        print(f"  raw ledger CSV for one day: {size / 1e6:.1f} MB in "
              f"{time.perf_counter() - t4:.1f} s", flush=True)
        db.session.remove()
        db.engine.dispose()


if __name__ == "__main__":
    main()
