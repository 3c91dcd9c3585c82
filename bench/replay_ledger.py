"""bench/replay.py's figures, every one a query over the ledger (``ledger_entries``) of
the variant's tenants: nothing here reads the bench's own counters."""
from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import sqlalchemy as sa

STAGES = ("cache", "routing", "minify", "prefix", "escalation")


def _entries():
    from app.ledger.models import LedgerEntry
    return LedgerEntry


def _passed(payload: dict) -> bool | None:
    fb = (payload or {}).get("feedback")
    if isinstance(fb, dict) and isinstance(fb.get("pass"), bool):
        return fb["pass"]
    return None


def _stage_columns(L) -> list[str] | None:
    cols = [f"saved_{s}_usd" for s in STAGES]
    return cols if all(hasattr(L, c) for c in cols) else None


def _stages_from_rows(rows, tiers: dict[str, Any]) -> dict[str, Decimal]:
    """Per-stage savings from the ledger's token and cost columns, for a ledger without
    per-stage columns: cache = a hit's baseline; minify = output tokens the client's keys
    would have cost, at the served tier's output price; prefix = reused prompt tokens at
    the served tier's input minus cached-input price; escalation = minus the discarded
    attempts' cost; routing = the rest of (baseline - cost)."""
    out = {s: Decimal(0) for s in STAGES}
    for r in rows:
        p = r.payload or {}
        if r.cache != "miss":
            out["cache"] += r.baseline_cost_usd
            continue
        t = tiers.get(r.tier)
        attempts = sum((Decimal(str(a.get("cost_usd") or 0)) for a in p.get("attempts") or ()),
                       Decimal(0))
        out["escalation"] -= attempts
        if t is not None:
            raw = ((p.get("pipeline") or {}).get("minify") or {}) \
                .get("raw_schema_output_tokens_equivalent")
            if raw:
                out["minify"] += (Decimal(int(raw)) - r.completion_tokens) \
                    * t.price_output_per_m / Decimal(1_000_000)
            out["prefix"] += r.cached_tokens * (t.price_input_per_m - t.price_cached_input_per_m) \
                / Decimal(1_000_000)
        out["routing"] += r.baseline_cost_usd - r.cost_usd
    out["routing"] -= out["minify"] + out["prefix"] + out["escalation"]
    return out


def _since(L, since: datetime | None, until: datetime | None = None):
    """Rows of the measured month only (a replay with prior months): booked at or after
    ``since`` and, for one pass of a steady-state ablation, before ``until``."""
    out = sa.true() if since is None else L.at >= since
    return out if until is None else sa.and_(out, L.at < until)


def headline(tenant_ids: list[int], since: datetime | None = None,
             until: datetime | None = None) -> dict[str, Any]:
    from app.catalog.models import Tier
    from app.extensions import db
    L = _entries()
    db.session.expire_all()
    mine = sa.and_(L.tenant_id.in_(tenant_ids), L.kind == "request", _since(L, since, until))
    rows = list(db.session.scalars(sa.select(L).where(mine)))
    n = len(rows)
    cost = sum((r.cost_usd for r in rows), Decimal(0))
    baseline = sum((r.baseline_cost_usd for r in rows), Decimal(0))
    shadow_cost, shadow_rows = db.session.execute(sa.select(
        sa.func.coalesce(sa.func.sum(L.cost_usd), 0), sa.func.count())
        .where(L.tenant_id.in_(tenant_ids), L.kind == "shadow", _since(L, since, until))).one()
    mix: dict[str, int] = {}
    for r in rows:
        k = f"cache {r.cache}" if r.cache != "miss" else (r.tier or "failed")
        mix[k] = mix.get(k, 0) + 1
    order = ["cache exact", "cache semantic", "tier-1", "tier-2", "tier-3", "failed"]
    mix = {k: mix[k] for k in order if k in mix}
    verdicts = [(r, _passed(r.payload)) for r in rows]
    judged = [(r, v) for r, v in verdicts if v is not None]
    pass_by_tier: dict[str, list] = {}
    for r, v in judged:
        k = f"cache {r.cache}" if r.cache != "miss" else (r.tier or "failed")
        pass_by_tier.setdefault(k, []).append(v)
    phases: dict[str, list] = {}   # how S01 chose: frontier_first, no_router, router, ...
    for r, v in verdicts:
        reason = "cache hit" if r.cache != "miss" else \
            ((r.payload or {}).get("caching_and_routing_decision") or {}).get("route_reason") or "none"
        ph = phases.setdefault(reason, [0, 0, 0, Decimal(0), Decimal(0)])
        ph[0] += 1
        ph[1] += v is True
        ph[2] += v is not None
        ph[3] += r.cost_usd
        ph[4] += r.baseline_cost_usd
    cols = _stage_columns(L)
    if cols:
        sums = db.session.execute(sa.select(*[sa.func.coalesce(sa.func.sum(getattr(L, c)), 0)
                                              for c in cols]).where(mine)).one()
        stages = {s: Decimal(v) for s, v in zip(STAGES, sums)}
        source = "the ledger's per-stage columns"
    else:
        tiers = {t.name: t for t in db.session.scalars(sa.select(Tier))}
        stages = _stages_from_rows(rows, tiers)
        source = "computed from the ledger's token and cost columns (no per-stage columns)"
    ttft = db.session.execute(sa.select(
        sa.func.percentile_cont(0.5).within_group(L.ttft_ms),
        sa.func.percentile_cont(0.95).within_group(L.ttft_ms)).where(mine)).one()
    per = Decimal(1000) / n if n else Decimal(0)
    return {"rows": n, "cost": cost, "baseline": baseline,
            "cut": float(1 - cost / baseline) if baseline else 0.0,
            "shadow_cost": Decimal(shadow_cost), "shadow_rows": shadow_rows,
            "cut_with_shadow": float(1 - (cost + Decimal(shadow_cost)) / baseline) if baseline else 0.0,
            "mix": mix, "judged": len(judged),
            "pass_rate": sum(v for _, v in judged) / len(judged) if judged else 0.0,
            "pass_by_tier": {k: (sum(v) / len(v), len(v)) for k, v in pass_by_tier.items()},
            "stages": stages, "stage_source": source, "phases": phases,
            "per_1k": cost * per, "baseline_per_1k": baseline * per,
            "ttft_p50": float(ttft[0] or 0), "ttft_p95": float(ttft[1] or 0),
            "escalated": sum(1 for r in rows if r.escalated)}


def frontier_pass_rate(tenant_ids: list[int], since: datetime | None = None,
                       until: datetime | None = None) -> dict[str, Any]:
    """Validator pass rate of the rows the frontier tier served (cache misses)."""
    from app.extensions import db
    L = _entries()
    rows = db.session.scalars(sa.select(L).where(L.tenant_id.in_(tenant_ids), _since(L, since, until),
                                                 L.kind == "request", L.cache == "miss",
                                                 L.tier == "tier-3"))
    verdicts = [v for v in (_passed(r.payload) for r in rows) if v is not None]
    return {"rate": sum(verdicts) / len(verdicts) if verdicts else 0.0, "n": len(verdicts)}


def count_rows(tenant_ids: list[int]) -> tuple[int, int]:
    """(request rows, rows with a feedback verdict) of these tenants."""
    from app.extensions import db
    L = _entries()
    db.session.expire_all()
    rows = list(db.session.scalars(sa.select(L).where(L.tenant_id.in_(tenant_ids),
                                                      L.kind == "request")))
    return len(rows), sum(1 for r in rows if _passed(r.payload) is not None)


def restamp(sent: list[dict], month_start: datetime) -> int:
    """Put the replayed rows at their month time (the replay ran in minutes): each request
    row, and its off-path exploration and adapter shadow rows a second later. Only for the
    console's month view; the headline is computed before."""
    from app.extensions import db
    L = _entries()
    n = 0
    for s in sent:
        if not s.get("rid"):
            continue
        at = month_start + timedelta(seconds=s["at"])
        n += db.session.execute(sa.update(L).where(L.request_id == s["rid"]).values(at=at)).rowcount
        db.session.execute(sa.update(L).where(L.request_id.in_(
            [f"{s['rid']}-explore", f"{s['rid']}-shadow"])).values(at=at + timedelta(seconds=1)))
    db.session.commit()
    return n
