"""Where the money went (issue 24): savings per pipeline stage, quality parity per cohort
and the 12-month view. Read from the rollups (and, for quality, the ledger's labels) and
scoped by user like every FinOps report; the console, the API and the CSV call these.

Stage lines add up to the period's saving (frontier baseline - charged cost): the five
ledger stages (``app.core.pricing.stage_savings``, at token prices), the self-hosted
pools' GPU-hour true-up (booked per-token estimates less the GPU-hour allocation that
replaced them; idle hours make it negative), adjustments (a charge is a negative line) and
what rows booked before per-stage savings saved (``unattributed``).
"""
from __future__ import annotations

import math
from datetime import datetime, timezone
from decimal import Decimal
from typing import Any, Iterable

import numpy as np
import sqlalchemy as sa

from app.core.costing import allocate, shown
from app.core.pricing import STAGES
from app.core.router_model import operating_point
from app.extensions import db
from app.finops import reports
from app.finops.models import Rollup
from app.finops.rollups import month_range, next_bucket
from app.ledger.models import LedgerEntry

ZERO = Decimal(0)
STAGE_LABELS = {"cache": "Cache hits (S00)", "routing": "Routing to cheaper tiers (S01)",
                "minify": "Output minification (S02)", "prefix": "Prefix reuse (S03)",
                "escalation": "Margin escalations (S04, a cost)",
                "gpu_true_up": "Pool GPU-hour true-up", "adjustments": "Adjustments",
                "unattributed": "Unattributed (booked before per-stage savings)"}
LINES = (*STAGES, "gpu_true_up", "adjustments", "unattributed")
QUALITY_MAX_ROWS = 200_000   # newest labelled requests read per report
EXPLORED_MAX = 20_000        # exploration verdicts joined by request id per report


def stage_lines(totals: dict[str, Any]) -> list[dict[str, Any]]:
    """One line per stage (``LINES`` order) with its exact ``amount``, ``amount_shown``
    (to the micro-dollar, summing exactly to the shown saving) and share of the baseline."""
    amounts = {s: totals[f"saved_{s}"] for s in STAGES}
    amounts["gpu_true_up"] = totals["pool_estimate"] - totals["gpu_cost"]
    amounts["adjustments"] = -totals["adjustments"]
    amounts["unattributed"] = totals["savings"] - sum(amounts.values(), ZERO)
    parts = allocate([amounts[k] for k in LINES])
    base = totals["baseline"]
    return [{"stage": k, "label": STAGE_LABELS[k], "amount": amounts[k], "amount_shown": p,
             "pct_of_baseline": float(amounts[k] / base * 100) if base else 0.0}
            for k, p in zip(LINES, parts)]


def stages(user, period: reports.Period, tenant_id: Any = None) -> dict[str, Any]:
    tid = reports.scoped_tenant(user, tenant_id)
    totals = reports._merge(reports._aggregate(period, tid, hist=False))
    return {"period": period, "tenant_id": tid, "lines": stage_lines(totals),
            "baseline_shown": shown(totals["baseline"]), "cost_shown": shown(totals["cost"]),
            "savings_shown": shown(totals["savings"]), "savings_pct": totals["savings_pct"]}


# --- quality parity per cohort ----------------------------------------------------------

def _labels_by_category(period: reports.Period, tenant_id: int | None
                        ) -> dict[str, list[tuple[int, list[int | None]]]]:
    """category -> [(served tier rank, per-tier labels)] of the period's served requests
    that carry a label (feedback, schema validity, an escalation, an exploration verdict),
    by the router's own label rules (``app.cascade.evaluation.tier_labels``)."""
    from app.cascade.evaluation import tier_labels
    from app.cascade.traces import explore_verdict, merge_shadow
    from app.catalog.models import Tier
    from app.workflows.models import Workflow
    L = LedgerEntry
    n_tiers = int(db.session.scalar(sa.select(sa.func.max(Tier.rank))) or 3)
    scope = [L.at >= period.start, L.at < period.end]
    if tenant_id is not None:
        scope.append(L.tenant_id == tenant_id)
    explored: dict[str, dict[str, bool]] = {}
    for (payload,) in db.session.execute(sa.select(L.payload).where(
            L.kind == "shadow", L.at >= period.start, *scope[1:])):
        found = explore_verdict(payload)
        if found is not None:
            explored.setdefault(found[0], {})[found[1]] = found[2]
    category = sa.func.coalesce(Workflow.category, sa.literal_column("'uncategorized'"))
    q = (sa.select(L.request_id, category, L.payload["tier_rank"], L.payload["feedback"],
                   L.payload[("pipeline", "schema_valid")], L.payload["escalated_from"],
                   L.payload["shadow"])
         .select_from(L).outerjoin(Workflow, sa.and_(Workflow.tenant_id == L.tenant_id,
                                                     Workflow.signature == L.workflow))
         .where(L.kind == "request", L.cache == "miss", *scope, _labelled(L, explored))
         .order_by(L.id.desc()).limit(QUALITY_MAX_ROWS))
    out: dict[str, list] = {}
    for rid, cat, rank, feedback, valid, escalated, shadow in db.session.execute(q):
        if not isinstance(rank, int) or not 1 <= rank <= n_tiers:
            continue
        trace = {"tier_rank": rank, "feedback": feedback, "schema_valid": valid,
                 "escalated_from": escalated if isinstance(escalated, list) else None,
                 "shadow": merge_shadow(shadow if isinstance(shadow, dict) else None,
                                        explored.get(rid))}
        labels = tier_labels(trace, n_tiers)
        if any(v is not None for v in labels):
            out.setdefault(cat, []).append((rank, labels))
    return out


def _labelled(L, explored: dict[str, Any]):
    """Rows that can carry a label (read without the unlabelled bulk of the ledger): a
    verdict, a schema check, an escalation, or an exploration verdict joined by id."""
    cond = [L.payload["feedback"].as_string().is_not(None),
            L.payload[("pipeline", "schema_valid")].as_string().is_not(None),
            L.payload["escalated_from"].as_string().is_not(None)]
    if explored:
        cond.append(L.request_id.in_(list(explored)[-EXPLORED_MAX:]))
    return sa.or_(*cond)


def parity(rows: Iterable[tuple[int, list[int | None]]]) -> dict[str, Any]:
    """Relative quality of what was served vs always the frontier (the router's own
    measure, ``router_model.operating_point``: each tier judged on its known labels), with
    ``n`` served answers whose label is known and ``n_frontier`` frontier labels it is
    relative to; None when either is 0."""
    rows = list(rows)
    if not rows:
        return {"relative_pct": None, "n": 0, "n_frontier": 0}
    chosen = np.array([r for r, _ in rows], dtype=int)
    labels = np.array([[math.nan if v is None else float(v) for v in lab] for _, lab in rows])
    point = operating_point(chosen, labels, np.zeros(labels.shape))
    n = int(sum(point["evaluated"].values()))
    n_frontier = int((~np.isnan(labels[:, -1])).sum())
    rel = point["relative_quality"] * 100 if n and n_frontier else None
    return {"relative_pct": rel, "n": n, "n_frontier": n_frontier}


def add_quality(data: dict[str, Any]) -> dict[str, Any]:
    """Put ``quality_parity_pct``, ``quality_n`` and ``quality_frontier_n`` on each cohort
    row of ``reports.cohorts`` (and its total)."""
    by_cat = _labels_by_category(data["period"], data["tenant_id"])
    for r in data["rows"]:
        _put(r, parity(by_cat.get(r["category"], ())))
    _put(data["total"], parity(x for rows in by_cat.values() for x in rows))
    return data


def _put(row: dict[str, Any], q: dict[str, Any]) -> None:
    row.update(quality_parity_pct=q["relative_pct"], quality_n=q["n"],
               quality_frontier_n=q["n_frontier"])


# --- twelve months ----------------------------------------------------------------------

def _month_start(at: datetime, back: int) -> datetime:
    y, m = at.year, at.month - back
    while m < 1:
        y, m = y - 1, m + 12
    return at.replace(year=y, month=m, day=1)


def twelve_months(user, period: reports.Period, tenant_id: Any = None,
                  now: datetime | None = None) -> dict[str, Any]:
    """Spend per month over the twelve months ending with the period's month (month
    rollups), the run-rate (the last month's spend, projected to the whole month while it
    is under way) and the annualised saving (the last month's saving, likewise, x 12)."""
    tid = reports.scoped_tenant(user, tenant_id)
    last, _ = month_range(period.start.strftime("%Y-%m"))
    first = _month_start(last, 11)
    end = next_bucket(last, "month")
    span = reports.Period(first, end, f"{first:%b %Y} – {last:%b %Y}")
    found = {r["g0"].strftime("%Y-%m") if hasattr(r["g0"], "strftime") else str(r["g0"])[:7]: r
             for r in reports._aggregate(span, tid, [Rollup.bucket_start], grain="month",
                                         hist=False)}
    months = []
    for i in range(12):
        start = _month_start(last, 11 - i)
        key = start.strftime("%Y-%m")
        r = found.get(key) or reports._empty()
        months.append({**r, "month": key, "label": start.strftime("%b %Y")})
    total = reports._merge(months)
    reports._display_shown(months, total, ("cost", "baseline", "savings"))
    now = now or datetime.now(timezone.utc)
    elapsed = (min(max(now, last), end) - last) / (end - last)
    cur = months[-1]
    frac = Decimal(str(elapsed)) if 0 < elapsed < 1 else Decimal(1)
    run_rate = cur["cost"] / frac
    saving_rate = cur["savings"] / frac
    return {"period": span, "tenant_id": tid, "months": months, "total": total,
            "month_elapsed_pct": float(frac * 100),
            "run_rate_monthly": run_rate, "run_rate_monthly_shown": shown(run_rate),
            "run_rate_annual": run_rate * 12, "run_rate_annual_shown": shown(run_rate * 12),
            "annualised_savings": saving_rate * 12,
            "annualised_savings_shown": shown(saving_rate * 12),
            "trailing_savings_shown": total["savings_shown"],
            "trailing_cost_shown": total["cost_shown"]}
