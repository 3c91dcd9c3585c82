"""The Overview: is everything fine, and what does it cost? One page for ops to leave
open on a screen (it refreshes itself), each figure linking to the page that explains it.

Traffic and money come from the FinOps rollups (today and yesterday, UTC, hour buckets:
``app.finops.reports.dashboard``), so they agree with FinOps to the micro-dollar and are
as of the last rollup run (``figures_as_of``; the page offers a refresh). Error and 429
rates over the last 24 h come from the ledger through its (tenant, at) index. Pools,
budget alerts, drills and adapter events are read as they are now. A tenant-scoped user
sees the same page for their tenant (no pools, no drills)."""
from __future__ import annotations

from datetime import date, datetime, timedelta, timezone
from typing import Any

import sqlalchemy as sa

from app.extensions import db


def _day(user, day: date) -> dict[str, Any]:
    from app.finops import reports
    d = reports.dashboard(user, reports.parse_period(start=day.isoformat(),
                                                     end=day.isoformat()))
    t = d["totals"]
    return {"requests": int(t["requests"]), "cost": t["cost"], "baseline": t["baseline"],
            "savings": t["savings"], "savings_pct": t["savings_pct"],
            "cache_pct": t["semantic_hit_pct"] + t["exact_hit_pct"],
            "semantic_pct": t["semantic_hit_pct"], "exact_pct": t["exact_hit_pct"],
            "ttft_p50": t["ttft_p50"], "ttft_p95": t["ttft_p95"],
            "tier_mix": d["tier_mix"]}


def status_rates(user, hours: int = 24) -> dict[str, Any]:
    """Requests, 5xx errors and 429 refusals booked over the last ``hours``."""
    from app.ledger.models import LedgerEntry as L
    from app.tenants.models import Tenant
    since = datetime.now(timezone.utc) - timedelta(hours=hours)
    # through the (tenant, at) index: the user's tenant, or every tenant by id
    ids = [user.tenant_id] if user.tenant_id is not None else \
        list(db.session.scalars(sa.select(Tenant.id)))
    if not ids:
        return {"requests": 0, "errors": 0, "refused": 0, "error_pct": None,
                "refused_pct": None, "hours": hours}
    n, errors, refused = db.session.execute(
        sa.select(sa.func.count(),
                  sa.func.coalesce(sa.func.sum(sa.case((L.status >= 500, 1), else_=0)), 0),
                  sa.func.coalesce(sa.func.sum(sa.case((L.status == 429, 1), else_=0)), 0))
        .where(L.tenant_id.in_(ids), L.at >= since, L.kind == "request")).one()
    n, errors, refused = int(n), int(errors), int(refused)
    return {"requests": n, "errors": errors, "refused": refused, "hours": hours,
            "error_pct": 100.0 * errors / n if n else None,
            "refused_pct": 100.0 * refused / n if n else None}


def pools() -> list[dict[str, Any]]:
    from app.catalog.models import Pool
    out = []
    for p in db.session.scalars(sa.select(Pool).order_by(Pool.name)):
        states: dict[str, int] = {}
        for r in p.replicas:
            states[r.state] = states.get(r.state, 0) + 1
        out.append({"id": p.id, "name": p.name, "desired": p.desired_replicas,
                    "healthy": states.get("healthy", 0), "states": states})
    return out


def budget_alerts(user, limit: int = 6) -> list[dict[str, Any]]:
    from app.finops.models import BudgetAlert
    from app.tenants.models import Tenant
    q = sa.select(BudgetAlert, Tenant.name).join(Tenant, Tenant.id == BudgetAlert.tenant_id)
    if user.tenant_id is not None:
        q = q.where(BudgetAlert.tenant_id == user.tenant_id)
    rows = db.session.execute(q.order_by(BudgetAlert.at.desc()).limit(limit)).all()
    return [{"tenant": name, "threshold_pct": a.threshold_pct, "spent_usd": a.spent_usd,
             "period": a.period, "at": a.at} for a, name in rows]


def drills(limit: int = 5) -> list[dict[str, Any]]:
    from app.drills.models import DrillRun
    return [{"id": d.id, "kind": d.kind, "status": d.status, "at": d.started_at}
            for d in db.session.scalars(sa.select(DrillRun).order_by(DrillRun.id.desc())
                                        .limit(limit))]


def adapter_events(user, limit: int = 6) -> list[dict[str, Any]]:
    from app.adapters.models import Adapter, AdapterEvent
    q = sa.select(AdapterEvent, Adapter).join(Adapter, Adapter.id == AdapterEvent.adapter_id)
    if user.tenant_id is not None:
        q = q.where(Adapter.tenant_id == user.tenant_id)
    rows = db.session.execute(q.order_by(AdapterEvent.id.desc()).limit(limit)).all()
    return [{"adapter_id": a.id, "adapter": a.name, "event": e.event, "to": e.to_state,
             "actor": e.actor_email, "at": e.at} for e, a in rows]


def overview(user, today: date | None = None) -> dict[str, Any]:
    from app.finops.service import figures_as_of
    today = today or datetime.now(timezone.utc).date()
    global_user = user.tenant_id is None
    return {"today": _day(user, today), "yesterday": _day(user, today - timedelta(days=1)),
            "day": today, "status": status_rates(user), "as_of": figures_as_of(),
            "pools": pools() if global_user else None,
            "alerts": budget_alerts(user), "drills": drills() if global_user else None,
            "adapter_events": adapter_events(user)}
