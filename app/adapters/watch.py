"""The canary watch: an adapter serving live traffic is rolled back by itself when its
traffic shows a regression (task ``adapters.canary_watch``, every 30 s).

For each adapter in canary or promoted, the ledger's requests it answered since it last
started serving (its ``approve`` or ``restore`` event) give two live signals:

- error rate: answers with status >= 500 among them;
- pass rate: the validator / ``/v1/feedback`` verdicts on them (``payload.feedback.pass``).

A signal counts only once there is enough of it (``ADAPTERS_WATCH_MIN_REQUESTS`` answers,
``ADAPTERS_WATCH_MIN_VERDICTS`` verdicts) and only when the regression holds with 95%
confidence: the Wilson interval's low end of the error rate is above the tenant's policy
``canary_max_error_rate``, or the high end of the pass rate is below
``canary_min_pass_rate``. A bad minute on a few requests is noise and rolls nothing back;
a real regression does, within one watch period of the evidence arriving.

The rollback is ``app.adapters.rollout.rollback`` acting as the system, with the figures
in its comment (audited, on the adapter's timeline): the adapter is unloaded and the one
it replaced serves again. What the watch saw is kept in ``adapter.live`` for the page.
"""
from __future__ import annotations

import logging
from datetime import datetime, timezone
from typing import Any

import sqlalchemy as sa
from flask import current_app

from app.adapters import states
from app.adapters.models import Adapter, AdapterEvent
from app.core.concordance import wilson
from app.extensions import db

log = logging.getLogger(__name__)

# events after which an adapter serves anew (its live record starts there)
_STARTS = ("approve", "restore")


def serving_since(adapter: Adapter) -> datetime | None:
    return db.session.scalar(sa.select(sa.func.max(AdapterEvent.at)).where(
        AdapterEvent.adapter_id == adapter.id, AdapterEvent.event.in_(_STARTS)))


def live_counts(adapter: Adapter, since: datetime | None) -> dict[str, int]:
    """{answers, errors, verdicts, passed} of the adapter's ledger rows since ``since``."""
    from app.ledger.models import LedgerEntry as L
    verdict = L.payload["feedback"]["pass"].as_boolean()
    q = sa.select(
        sa.func.count(),
        sa.func.coalesce(sa.func.sum(sa.case((L.status >= 500, 1), else_=0)), 0),
        sa.func.coalesce(sa.func.sum(sa.case((verdict.is_not(None), 1), else_=0)), 0),
        sa.func.coalesce(sa.func.sum(sa.case((verdict.is_(True), 1), else_=0)), 0),
    ).where(L.kind == "request", L.tenant_id == adapter.tenant_id, L.adapter == adapter.name)
    if since is not None:
        q = q.where(L.at >= since)
    answers, errors, verdicts, passed = db.session.execute(q).one()
    return {"answers": int(answers), "errors": int(errors), "verdicts": int(verdicts),
            "passed": int(passed)}


def judge(counts: dict[str, int], policy: dict[str, Any], min_requests: int,
          min_verdicts: int) -> tuple[dict[str, Any], str | None]:
    """(live stats, why it regressed or None)."""
    err_low, err_high = wilson(counts["errors"], counts["answers"])
    pass_low, pass_high = wilson(counts["passed"], counts["verdicts"])
    stats = {**counts,
             "error_rate": round(counts["errors"] / counts["answers"], 6)
             if counts["answers"] else None,
             "error_ci": [round(err_low, 6), round(err_high, 6)],
             "pass_rate": round(counts["passed"] / counts["verdicts"], 6)
             if counts["verdicts"] else None,
             "pass_ci": [round(pass_low, 6), round(pass_high, 6)]}
    max_err = float(policy["canary_max_error_rate"])
    min_pass = float(policy["canary_min_pass_rate"])
    if counts["answers"] >= min_requests and err_low > max_err:
        return stats, (f"error rate {stats['error_rate']:.1%} over {counts['answers']} answers "
                       f"(95% low bound {err_low:.1%}) is above the policy's {max_err:.1%}")
    if counts["verdicts"] >= min_verdicts and pass_high < min_pass:
        return stats, (f"pass rate {stats['pass_rate']:.1%} over {counts['verdicts']} verdicts "
                       f"(95% high bound {pass_high:.1%}) is below the policy's {min_pass:.1%}")
    return stats, None


def canary_watch() -> list[dict[str, Any]]:
    """Update every serving adapter's ``live`` record; roll back those that regressed.
    Returns one line per adapter: {id, name, state, rolled_back, why, **stats}."""
    from app.adapters import rollout, service
    from app.policies.service import effective_policy
    cfg = current_app.config
    min_requests = int(cfg["ADAPTERS_WATCH_MIN_REQUESTS"])
    min_verdicts = int(cfg["ADAPTERS_WATCH_MIN_VERDICTS"])
    now = datetime.now(timezone.utc).isoformat()
    out, regressed = [], []
    for a in db.session.scalars(sa.select(Adapter).where(Adapter.state.in_(states.SERVING))
                                .order_by(Adapter.id)):
        since = serving_since(a)
        stats, why = judge(live_counts(a, since), effective_policy(a.tenant_id),
                           min_requests, min_verdicts)
        a.live = {**stats, "since": since.isoformat() if since else None, "updated_at": now}
        if why:
            regressed.append((a.id, why))
        out.append({"id": a.id, "name": a.name, "state": a.state, "rolled_back": bool(why),
                    "why": why, **stats})
    db.session.commit()
    for adapter_id, why in regressed:
        try:
            rollout.rollback(service.SYSTEM, adapter_id, f"automatic rollback: {why}")
            log.warning("adapter %s rolled back: %s", adapter_id, why)
        except Exception:  # noqa: BLE001 - one adapter's failure leaves the others to go
            db.session.rollback()
            log.exception("adapter %s: automatic rollback failed", adapter_id)
    return out
