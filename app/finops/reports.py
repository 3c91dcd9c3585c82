"""FinOps reports, read from the rollups and scoped by user: a tenant-scoped user
(department lead) sees only their own tenant. The console, the API and the CSV export
all call these."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any, Iterable, Iterator, Sequence

import sqlalchemy as sa

from app.core.costing import allocate, format_usd, shown
from app.core.pricing import STAGES
from app.errors import Forbidden, ValidationError
from app.extensions import db
from app.finops import histogram
from app.contract.budget import current_period
from app.finops.models import TTFT_BUCKET_COLUMNS, Budget, Rollup
from app.finops.rollups import IDLE_WORKFLOW, ceil_bucket, floor_bucket, month_range, next_bucket
from app.ledger.models import OFF_PATH_KINDS, LedgerEntry
from app.tenants.models import Tenant
from app.workflows.models import Workflow

ZERO = Decimal(0)


@dataclass(frozen=True)
class Period:
    start: datetime
    end: datetime
    label: str

    @property
    def days(self) -> float:
        return (self.end - self.start).total_seconds() / 86400

    @property
    def is_month(self) -> bool:
        return self.start.day == 1 and self.end == next_bucket(self.start, "month") \
            and self.start == floor_bucket(self.start, "month")

    def grain(self) -> str:
        """The coarsest grain whose buckets tile the period."""
        for grain in ("month", "day", "hour"):
            if floor_bucket(self.start, grain) == self.start and \
                    ceil_bucket(self.end, grain) == self.end:
                if grain != "month" or self.is_month or self.days > 31:
                    return grain
        return "hour"

    def timeline_grain(self) -> str:
        return "hour" if self.days <= 3 else "day"


def parse_period(period: str | None = None, start: str | None = None,
                 end: str | None = None) -> Period:
    """'YYYY-MM' (default: this month), or start/end dates (YYYY-MM-DD, end inclusive)."""
    if any(v is not None and not isinstance(v, str) for v in (period, start, end)):
        raise ValidationError("the period is not valid: use YYYY-MM or start/end dates",
                              {"period": ["text: YYYY-MM or YYYY-MM-DD"]})
    try:
        if start or end:
            d0 = date.fromisoformat((start or end or "")[:10])
            d1 = date.fromisoformat((end or start or "")[:10])
            if d1 < d0:
                raise ValueError
            s = datetime(d0.year, d0.month, d0.day, tzinfo=timezone.utc)
            e = datetime(d1.year, d1.month, d1.day, tzinfo=timezone.utc) + timedelta(days=1)
            return Period(s, e, f"{d0.isoformat()} – {d1.isoformat()}")
        period = period or current_period()
        s, e = month_range(period)
        return Period(s, e, s.strftime("%B %Y"))
    except (ValueError, OverflowError):
        raise ValidationError("the period is not valid: use YYYY-MM or start/end dates",
                              {"period": ["use YYYY-MM or YYYY-MM-DD"]}) from None


def scoped_tenant(user, tenant_id: Any = None) -> int | None:
    """The tenant a report is restricted to: a tenant-scoped user's own, always."""
    wanted = None
    if tenant_id not in (None, "", "all"):
        try:
            wanted = int(tenant_id)
        except (TypeError, ValueError):
            raise ValidationError("tenant must be an id", {"tenant": ["not an id"]}) from None
    if user.tenant_id is not None:
        if wanted is not None and wanted != user.tenant_id:
            raise Forbidden("you can only see your own tenant's numbers")
        return user.tenant_id
    return wanted


def visible_tenants(user) -> list[Tenant]:
    q = sa.select(Tenant).order_by(Tenant.name)
    if user.tenant_id is not None:
        q = q.where(Tenant.id == user.tenant_id)
    return list(db.session.scalars(q))


# --- shared aggregation ---------------------------------------------------------------

_HIST = [sa.func.coalesce(sa.func.sum(getattr(Rollup, c)), 0) for c in TTFT_BUCKET_COLUMNS]
_SUMS = {"requests": Rollup.requests, "cache_exact": Rollup.cache_exact,
         "cache_semantic": Rollup.cache_semantic, "escalations": Rollup.escalations,
         "prompt_tokens": Rollup.prompt_tokens, "cached_tokens": Rollup.cached_tokens,
         "completion_tokens": Rollup.completion_tokens,
         "raw_output_tokens": Rollup.raw_schema_output_tokens, "booked": Rollup.cost_usd,
         "gpu_cost": Rollup.gpu_cost_usd, "baseline": Rollup.baseline_cost_usd,
         "cache_saved": Rollup.cache_saved_usd, "adjustments": Rollup.adjustment_usd,
         "pool_estimate": Rollup.pool_estimate_usd,
         **{f"saved_{s}": getattr(Rollup, f"saved_{s}_usd") for s in STAGES},
         "ttft_sum": Rollup.ttft_ms_sum, "ttft_count": Rollup.ttft_count}


def _aggregate(period: Period, tenant_id: int | None, group_by: Sequence = (), *,
               grain: str | None = None, join_workflow: bool = False, hist: bool = True,
               include_idle: bool = True) -> list[dict[str, Any]]:
    grain = grain or period.grain()
    cols = [sa.func.coalesce(sa.func.sum(c), 0).label(k) for k, c in _SUMS.items()]
    q = sa.select(*group_by, *cols, *(_HIST if hist else ()))
    if join_workflow:
        q = q.select_from(Rollup).outerjoin(Workflow, sa.and_(
            Workflow.tenant_id == Rollup.tenant_id, Workflow.signature == Rollup.workflow))
    q = q.where(Rollup.grain == grain, Rollup.bucket_start >= period.start,
                Rollup.bucket_start < period.end)
    if tenant_id is not None:
        q = q.where(Rollup.tenant_id == tenant_id)
    elif not include_idle:
        q = q.where(Rollup.workflow != IDLE_WORKFLOW)
    if group_by:
        q = q.group_by(*group_by).order_by(*group_by)
    out = []
    n_group, n_sums = len(group_by), len(_SUMS)
    for row in db.session.execute(q):
        d = {f"g{i}": row[i] for i in range(n_group)}
        d.update({k: row[n_group + i] for i, k in enumerate(_SUMS)})
        if hist:
            d["hist"] = [int(x or 0) for x in row[n_group + n_sums:]]
        out.append(_derive(d))
    return out


def _derive(d: dict[str, Any]) -> dict[str, Any]:
    """Derived figures of summed rollup columns. ``token_cost``: what was booked per token
    (external tiers, pools without a GPU rate, adjustments) less the pool estimates the
    GPU-hour allocation replaced; ``cost`` = that + ``gpu_cost`` (see app.finops.rollups)."""
    for k in ("booked", "gpu_cost", "baseline", "cache_saved", "adjustments", "pool_estimate",
              *(f"saved_{s}" for s in STAGES)):
        d[k] = Decimal(d[k] or 0)
    d["token_cost"] = d["booked"] - d["pool_estimate"]
    d["cost"] = d["token_cost"] + d["gpu_cost"]
    d["savings"] = d["baseline"] - d["cost"]
    d["savings_pct"] = float(d["savings"] / d["baseline"] * 100) if d["baseline"] else 0.0
    req = int(d["requests"] or 0)
    hits = int(d["cache_exact"] or 0) + int(d["cache_semantic"] or 0)
    served = max(req - hits, 0)
    d["served"] = served
    d["tokens"] = int(d["prompt_tokens"] or 0) + int(d["completion_tokens"] or 0)
    d["semantic_hit_pct"] = 100.0 * int(d["cache_semantic"] or 0) / req if req else 0.0
    d["exact_hit_pct"] = 100.0 * int(d["cache_exact"] or 0) / req if req else 0.0
    d["prefix_hit_pct"] = 100.0 * int(d["cached_tokens"] or 0) / int(d["prompt_tokens"]) \
        if d["prompt_tokens"] else 0.0
    d["output_per_request"] = int(d["completion_tokens"] or 0) / served if served else 0.0
    d["raw_output_per_request"] = int(d["raw_output_tokens"] or 0) / served if served else 0.0
    d["cost_per_1k"] = d["cost"] / req * 1000 if req else ZERO
    hist = d.get("hist") or []
    d["ttft_p50"] = histogram.percentile(hist, 0.5) if hist else None
    d["ttft_p95"] = histogram.percentile(hist, 0.95) if hist else None
    d["ttft_mean"] = float(d["ttft_sum"]) / int(d["ttft_count"]) if d["ttft_count"] else None
    return d


def _empty() -> dict[str, Any]:
    return _derive({k: 0 for k in _SUMS} | {"hist": [0] * histogram.N_BUCKETS})


def short_money(amount: Decimal) -> str:
    """$139.2K / $43.98K / $512.40 — the seed's headline style."""
    a = abs(Decimal(amount))
    sign = "-" if amount < 0 else ""
    if a >= 1_000_000:
        return f"{sign}${a / 1_000_000:.3g}M"
    if a >= 1000:
        return f"{sign}${a / 1000:.4g}K"
    return f"{sign}{format_usd(a)}"


# --- dashboard ------------------------------------------------------------------------

def dashboard(user, period: Period, tenant_id: Any = None) -> dict[str, Any]:
    tid = scoped_tenant(user, tenant_id)
    grain = period.timeline_grain()
    bucket = Rollup.bucket_start
    timeline = _aggregate(period, tid, [bucket], grain=grain)
    totals = _merge(timeline)
    tiers = _aggregate(period, tid, [Rollup.tier], hist=False, include_idle=True)
    mix = [{"tier": t["g0"] or "(none)", "requests": t["served"]} for t in tiers if t["served"]]
    hits = sum(int(t["cache_exact"]) + int(t["cache_semantic"]) for t in tiers)
    if hits:
        mix.append({"tier": "cache", "requests": hits})
    counted = counted_usage(period, tid)
    total_mix = sum(m["requests"] for m in mix) or 1
    for m in mix:
        m["pct"] = 100.0 * m["requests"] / total_mix
    return {"period": period, "tenant_id": tid, "grain": grain, "totals": totals,
            "headline": {"baseline": short_money(totals["baseline"]),
                         "actual": short_money(totals["cost"]),
                         "per": "/mo" if period.is_month else f" over {period.days:g} days",
                         "delta_pct": -totals["savings_pct"],
                         "savings": short_money(totals["savings"])},
            "timeline": [{"bucket": t["g0"], "cost": t["cost"], "baseline": t["baseline"],
                          "requests": t["requests"], "semantic_hit_pct": t["semantic_hit_pct"],
                          "exact_hit_pct": t["exact_hit_pct"],
                          "prefix_hit_pct": t["prefix_hit_pct"], "ttft_p50": t["ttft_p50"],
                          "ttft_p95": t["ttft_p95"],
                          "output_per_request": t["output_per_request"],
                          "cost_per_1k": t["cost_per_1k"]} for t in timeline],
            "tier_mix": mix, "counted": counted, "off_path": off_path_usage(period, tid)}


def counted_usage(period: Period, tenant_id: int | None) -> dict[str, Any]:
    """Requests booked on the gateway's own token count (streams that ended before the
    engine's usage: ``app.gateway.usage``): how many, and what they cost. Read from the
    ledger through its partial index on those rows."""
    q = (sa.select(sa.func.count(), sa.func.coalesce(sa.func.sum(LedgerEntry.cost_usd), 0))
         .where(LedgerEntry.usage_source == "counted", LedgerEntry.at >= period.start,
                LedgerEntry.at < period.end))
    if tenant_id is not None:
        q = q.where(LedgerEntry.tenant_id == tenant_id)
    n, cost = db.session.execute(q).one()
    return {"requests": int(n), "cost": Decimal(cost)}


OFF_PATH_LABELS = {"shadow": "Exploration and adapter shadow",
                   "cache_verify": "Cache verification"}


def off_path_usage(period: Period, tenant_id: int | None) -> dict[str, Any]:
    """What the gateway's off-path runs cost (``OFF_PATH_KINDS``: no tenant's spend, so in
    no rollup, budget or total), per kind: {"rows": [{kind, label, runs, cost}], "cost"}.
    Read from the ledger."""
    q = (sa.select(LedgerEntry.kind, sa.func.count(),
                   sa.func.coalesce(sa.func.sum(LedgerEntry.cost_usd), 0))
         .where(LedgerEntry.kind.in_(OFF_PATH_KINDS), LedgerEntry.at >= period.start,
                LedgerEntry.at < period.end)
         .group_by(LedgerEntry.kind))
    if tenant_id is not None:
        q = q.where(LedgerEntry.tenant_id == tenant_id)
    found = {kind: (int(n), Decimal(cost)) for kind, n, cost in db.session.execute(q)}
    rows = [{"kind": k, "label": OFF_PATH_LABELS[k], "runs": found.get(k, (0, 0))[0],
             "cost": Decimal(found.get(k, (0, 0))[1])} for k in OFF_PATH_KINDS]
    return {"rows": rows, "cost": sum((r["cost"] for r in rows), Decimal(0))}


def _merge(rows: Iterable[dict[str, Any]]) -> dict[str, Any]:
    rows = list(rows)
    if not rows:
        return _empty()
    d = {k: sum((r[k] for r in rows), Decimal(0) if isinstance(rows[0][k], Decimal) else 0)
         for k in _SUMS}
    d["hist"] = histogram.merge([r.get("hist") or [] for r in rows])
    return _derive(d)


# --- cohort table (seed 6.3) ----------------------------------------------------------

COHORT_LABELS = {"structured_extraction": "Structured JSON Extraction & Classification",
                 "support_rag": "Customer Support & Internal Knowledge RAG",
                 "code_sql": "Code Generation, SQL & AST Refactoring",
                 "complex_reasoning": "Complex Legal, Financial & Multi-Hop Reasoning",
                 "batch_summarization": "High-Volume Async Batch Summarization",
                 "uncategorized": "Uncategorized"}


def cohorts(user, period: Period, tenant_id: Any = None) -> dict[str, Any]:
    tid = scoped_tenant(user, tenant_id)
    category = sa.func.coalesce(Workflow.category, sa.literal_column("'uncategorized'"))
    rows = _aggregate(period, tid, [category, Rollup.tier], join_workflow=True,
                      include_idle=False)
    by_cat: dict[str, list[dict]] = {}
    for r in rows:
        by_cat.setdefault(r["g0"], []).append(r)
    out = []
    for cat, parts in by_cat.items():
        m = _merge(parts)
        tier_req = {(p["g1"] or "(none)"): p["served"] for p in parts if p["served"]}
        hits = int(m["cache_exact"]) + int(m["cache_semantic"])
        if hits:
            tier_req["cache"] = hits
        shares = sorted(tier_req.items(), key=lambda kv: -kv[1])
        n = sum(tier_req.values()) or 1
        m.update(category=cat, label=COHORT_LABELS.get(cat, cat),
                 tier_shares=[(t, 100.0 * c / n) for t, c in shares],
                 dominant=" / ".join(f"{100.0 * c / n:.0f}% {t}" for t, c in shares[:2]))
        out.append(m)
    out.sort(key=lambda r: -r["tokens"])
    total = _merge(out) if out else _empty()
    all_tokens = total["tokens"] or 1
    for r in out:
        r["token_share_pct"] = 100.0 * r["tokens"] / all_tokens
    _display_shown(out, total, ("baseline", "cost", "savings"))
    for r in (*out, total):   # the change against all-frontier, as the page shows it
        r["delta_shown"] = r["cost_shown"] - r["baseline_shown"]
        r["delta_pct"] = -r["savings_pct"]
    return {"period": period, "tenant_id": tid, "rows": out, "total": total}


def _display_shown(rows: list[dict], total: dict, fields: Sequence[str]) -> None:
    """``<field>_shown`` on each row (to the micro-dollar, ``costing.allocate``), summing
    exactly to the total's: what the page and the CSV both show."""
    for f in fields:
        parts = allocate([r[f] for r in rows])
        for r, c in zip(rows, parts):
            r[f + "_shown"] = c
        total[f + "_shown"] = shown(total[f])


# --- showback / chargeback ------------------------------------------------------------

def showback(user, period: Period, tenant_id: Any = None) -> dict[str, Any]:
    tid = scoped_tenant(user, tenant_id)
    rows = _aggregate(period, tid, [Rollup.tenant_id], hist=False)
    names = {t.id: t for t in db.session.scalars(sa.select(Tenant))}
    budgets = {b.tenant_id: b for b in db.session.scalars(sa.select(Budget))}
    for r in rows:
        t = names.get(r["g0"])
        r["tenant_id"] = r["g0"]
        r["tenant"] = t.name if t else ("Unallocated GPU idle" if r["g0"] == 0 else str(r["g0"]))
        r["department"] = t.department if t else ""
        b = budgets.get(r["g0"])
        r["budget_usd"] = b.monthly_limit_usd if b else None
        r["budget_used_pct"] = float(r["cost"] / b.monthly_limit_usd * 100) \
            if b and b.monthly_limit_usd else None
    rows.sort(key=lambda r: (r["tenant_id"] == 0, -r["cost"]))
    total = _merge(rows) if rows else _empty()
    _display_shown(rows, total, ("token_cost", "gpu_cost", "adjustments", "cost", "baseline",
                                 "savings"))
    return {"period": period, "tenant_id": tid, "rows": rows, "total": total}


# --- CSV ------------------------------------------------------------------------------

REPORT_COLUMNS: dict[str, list[tuple[str, str]]] = {
    "cohorts": [("category", "category"), ("label", "label"), ("tokens", "tokens"),
                ("token_share_pct", "token_share_pct"), ("dominant", "dominant_tier"),
                ("prefix_hit_pct", "prefix_hit_pct"), ("semantic_hit_pct", "semantic_hit_pct"),
                ("requests", "requests"), ("baseline_shown", "baseline_usd"),
                ("cost_shown", "actual_usd"), ("delta_shown", "delta_usd"),
                ("delta_pct", "delta_pct"), ("ttft_p50", "ttft_p50_ms"),
                ("quality_parity_pct", "quality_parity_pct"), ("quality_n", "quality_labels"),
                ("quality_frontier_n", "quality_frontier_labels")],
    "stages": [("stage", "stage"), ("label", "label"), ("amount_shown", "saved_usd"),
               ("pct_of_baseline", "pct_of_baseline")],
    "months": [("month", "month"), ("requests", "requests"), ("cost_shown", "actual_usd"),
               ("baseline_shown", "baseline_usd"), ("savings_shown", "savings_usd"),
               ("savings_pct", "savings_pct")],
    "showback": [("tenant_id", "tenant_id"), ("tenant", "tenant"), ("department", "department"),
                 ("requests", "requests"), ("tokens", "tokens"),
                 ("token_cost_shown", "token_cost_usd"), ("gpu_cost_shown", "gpu_cost_usd"),
                 ("adjustments_shown", "adjustments_usd"), ("cost_shown", "chargeback_usd"),
                 ("baseline_shown", "baseline_usd"), ("savings_shown", "savings_usd"),
                 ("budget_usd", "budget_usd")],
    "off_path": [("kind", "kind"), ("label", "label"), ("runs", "runs"), ("cost", "cost_usd")],
    "dashboard": [("bucket", "bucket_start"), ("requests", "requests"), ("cost", "cost_usd"),
                  ("baseline", "baseline_usd"), ("semantic_hit_pct", "semantic_hit_pct"),
                  ("exact_hit_pct", "exact_hit_pct"), ("prefix_hit_pct", "prefix_hit_pct"),
                  ("ttft_p50", "ttft_p50_ms"), ("ttft_p95", "ttft_p95_ms"),
                  ("output_per_request", "output_tokens_per_request"),
                  ("cost_per_1k", "cost_per_1k_requests_usd")],
}
LEDGER_COLUMNS = ("request_id", "kind", "at", "tenant_id", "workflow", "tier", "model",
                  "status", "cache", "prompt_tokens", "cached_tokens", "completion_tokens",
                  "cost_usd", "baseline_cost_usd", "escalated", "ttft_ms", "latency_ms",
                  "usage_source", *(f"saved_{s}_usd" for s in STAGES))


def report_rows(user, report: str, period: Period, tenant_id: Any = None
                ) -> tuple[list[str], list[list[Any]]]:
    """Header and rows of a named report for CSV (totals row last where there is one)."""
    if report not in REPORT_COLUMNS:
        raise ValidationError(f"no report {report!r}", {"report": list(REPORT_COLUMNS)})
    from app.finops import savings
    cols = REPORT_COLUMNS[report]
    if report == "dashboard":
        rows = dashboard(user, period, tenant_id)["timeline"]
        total = None
    elif report == "off_path":
        data = off_path_usage(period, scoped_tenant(user, tenant_id))
        rows = data["rows"]
        total = {"kind": "total", "label": "Off-path runs (on no budget)",
                 "runs": sum(r["runs"] for r in rows), "cost": data["cost"]}
    elif report == "stages":
        data = savings.stages(user, period, tenant_id)
        rows = data["lines"]
        total = {"stage": "total", "label": "Saved (baseline - actual)",
                 "amount_shown": data["savings_shown"], "pct_of_baseline": data["savings_pct"]}
    elif report == "months":
        data = savings.twelve_months(user, period, tenant_id)
        rows, total = data["months"], {**data["total"], "month": "total"}
    else:
        data = savings.add_quality(cohorts(user, period, tenant_id)) if report == "cohorts" \
            else showback(user, period, tenant_id)
        rows, total = data["rows"], data["total"]
        total = {**total, "category": "total", "label": "Total", "tenant": "Total",
                 "dominant": ""}
    body = [[_cell(r.get(k)) for k, _ in cols] for r in rows]
    if total is not None:
        body.append([_cell(total.get(k)) for k, _ in cols])
    return [h for _, h in cols], body


def _cell(v: Any) -> Any:
    if isinstance(v, Decimal):
        return format_usd(v, grouped=False, symbol=False)   # money, as the page shows it
    if isinstance(v, float):
        return f"{v:.2f}"
    if isinstance(v, datetime):
        return v.isoformat()
    return "" if v is None else v


def ledger_rows(user, period: Period, tenant_id: Any = None, batch: int = 5000
                ) -> Iterator[list[Any]]:
    """Raw ledger rows of the period, streamed from a server-side cursor. The scope is
    checked now, not at the first row."""
    tid = scoped_tenant(user, tenant_id)
    q = (sa.select(*[getattr(LedgerEntry, c) for c in LEDGER_COLUMNS])
         .where(LedgerEntry.at >= period.start, LedgerEntry.at < period.end)
         .order_by(LedgerEntry.at, LedgerEntry.id))
    if tid is not None:
        q = q.where(LedgerEntry.tenant_id == tid)

    def rows() -> Iterator[list[Any]]:
        for row in db.session.execute(q.execution_options(yield_per=batch)):
            yield [_cell(v) for v in row]
    return rows()
