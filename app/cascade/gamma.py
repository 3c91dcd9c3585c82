"""γ calibration per model and tier (issue 24): fit S04's margin threshold on labelled
traces for a target escalation recall or precision (``app.core.margin_calibration``) and
save it on the tier (``Tier.margin_gamma``, published with the snapshot; S04 uses it over
the policy's ``margin_gamma``). The CLI (``flask sluice calibrate-gamma``), the Routing
page and ``POST /api/v1/router/gamma`` all call ``calibrate``.

Labelled traces come from the ledger or are given (a file the CLI reads, e.g. the per-item
results ``bench/margin.py --out`` writes; a list in the API body). From the ledger, a trace
is one margin check S04 made on the tier (``payload.pipeline.margin_checks``) whose answer
was served and judged: correct = the request's outcome by the router's rule (client
feedback, else schema validity). An escalated answer was never served, so the ledger holds
no label for margins below the γ in force: ledger traces can show what a higher γ would
catch, not what a lower one would let through (give labelled traces for that).
"""
from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any, Iterable, Mapping

import sqlalchemy as sa

from app.audit.service import record
from app.catalog.models import Tier
from app.core import margin_calibration as mc
from app.errors import Forbidden, NotFound, ValidationError
from app.extensions import db
from app.ledger.models import LedgerEntry
from app.models_base import row_id
from app.snapshot.service import publish_after_commit

MAX_LEDGER_ROWS = 100_000
MAX_GIVEN = 100_000


def _tier(tier_ref: Any) -> Tier:
    tier = None
    rid = row_id(tier_ref)
    if rid is not None:
        tier = db.session.get(Tier, rid)
    if tier is None and isinstance(tier_ref, str) and tier_ref and len(tier_ref) <= 64 \
            and "\x00" not in tier_ref:
        tier = db.session.scalar(sa.select(Tier).where(Tier.name == tier_ref))
    if tier is None:
        raise NotFound("no such tier", {"tier": ["unknown tier"]})
    return tier


def ledger_traces(tier: Tier, *, days: float = 30.0, model: str | None = None
                  ) -> list[tuple[float, bool]]:
    """(margin, correct) of S04's checks on ``tier`` over the last ``days`` whose answer
    was served and has an outcome; ``model``: only rows that model served (the tier's
    model, or one of its adapters' names), default any."""
    from app.cascade.evaluation import outcome
    from app.cascade.traces import schema_valid
    L = LedgerEntry
    since = datetime.now(timezone.utc) - timedelta(days=days)
    q = (sa.select(L.model, L.payload).where(L.kind == "request", L.cache == "miss",
                                             L.tier == tier.name, L.at >= since)
         .order_by(L.id.desc()).limit(MAX_LEDGER_ROWS))
    out = []
    for served_model, payload in db.session.execute(q):
        if model and served_model != model:
            continue
        p = payload or {}
        ok = outcome({"feedback": p.get("feedback"), "schema_valid": schema_valid(p)})
        if ok is None:
            continue
        checks = [c for c in (p.get("pipeline") or {}).get("margin_checks") or ()
                  if isinstance(c, Mapping) and c.get("tier") == tier.name
                  and c.get("decision") == "pass"]
        if checks:
            out.append((checks[-1].get("margin"), ok))
    return out


def given_traces(items: Iterable[Any]) -> list[tuple[Any, Any]]:
    """Traces given as dicts: ``margin`` (or ``margin_window``, bench/margin.py's field) and
    ``correct``; anything else is refused."""
    out = []
    for i, it in enumerate(items):
        if i >= MAX_GIVEN:
            raise ValidationError("too many traces", {"traces": [f"at most {MAX_GIVEN}"]})
        if not isinstance(it, Mapping):
            raise ValidationError("a trace is an object", {"traces": [f"item {i}: not an object"]})
        out.append((it.get("margin", it.get("margin_window")), it.get("correct")))
    return out


def _check(kind: Any, target: Any) -> tuple[str, float]:
    errors: dict[str, list[str]] = {}
    if kind not in mc.KINDS:
        errors["kind"] = [f"one of {', '.join(mc.KINDS)}"]
    try:
        value = float(target)
        if not 0.0 < value <= 1.0:
            raise ValueError
    except (TypeError, ValueError):
        errors["target"] = ["a fraction in (0, 1], e.g. 0.5"]
        value = 0.0
    if errors:
        raise ValidationError("the calibration target is not valid", errors)
    return str(kind), value


def calibrate(user, tier_ref: Any, kind: Any, target: Any, *, traces: Iterable[Any] | None = None,
              days: float = 30.0, model: str | None = None, save: bool = False
              ) -> dict[str, Any]:
    """Fit γ for ``tier_ref`` (id or name) to ``target`` recall/precision on ``traces``
    (given) or the tier's ledger traces; with ``save``, store it on the tier (audited,
    published). Returns the fit (``app.core.margin_calibration.fit_gamma``) with the tier,
    the source, the γ in force and whether it was saved."""
    if not user.can("catalog.manage"):
        raise Forbidden("γ is a tier setting: global admin or ops only")
    tier = _tier(tier_ref)
    kind, value = _check(kind, target)
    if not 0 < days <= 3650:
        raise ValidationError("the ledger window is 1 day to 10 years", {"days": ["1 to 3650"]})
    if traces is not None:
        raw, source = given_traces(traces), "given traces"
    else:
        raw = ledger_traces(tier, days=days, model=model)
        source = f"ledger, last {days:g} days" + (f", model {model}" if model else "")
    margins, correct = mc.labelled(raw)
    fit = mc.fit_gamma(margins, correct, kind, value)
    result = {**fit, "tier": tier.name, "tier_id": tier.id, "model": model or tier.model,
              "source": source, "gamma_before": tier.margin_gamma, "saved": False}
    if save:
        if fit["gamma"] is None:
            raise ValidationError(f"nothing saved: {fit['reason']}",
                                  {"target": [fit["reason"]]})
        save_gamma(user, tier, fit["gamma"], note=f"{kind} {value:g} on {len(margins)} "
                                                  f"traces ({source})")
        result["saved"] = True
    return result


def save_gamma(user, tier_ref: Any, gamma: Any, *, note: str = "") -> Tier:
    """Set (or, with None, clear) the tier's γ; audited and published to the gateways."""
    if not user.can("catalog.manage"):
        raise Forbidden("γ is a tier setting: global admin or ops only")
    tier = tier_ref if isinstance(tier_ref, Tier) else _tier(tier_ref)
    if gamma is not None:
        try:
            gamma = round(float(gamma), mc.DIGITS)
            if not 0.0 <= gamma <= 20.0:
                raise ValueError
        except (TypeError, ValueError):
            raise ValidationError("γ must be a number from 0 to 20",
                                  {"gamma": ["a number from 0 to 20"]}) from None
    before = tier.margin_gamma
    tier.margin_gamma = gamma
    db.session.flush()
    record(user, "tier.margin_gamma", "tier", tier.id, before={"margin_gamma": before},
           after={"margin_gamma": gamma, **({"note": note} if note else {})})
    db.session.commit()
    publish_after_commit()
    return tier
