"""FinOps operations: adjustments, budgets (SQL side, alerts, Redis mirror) and rollup
runs. Prices live in ``app.finops.prices``."""
from __future__ import annotations

import logging
import time
import uuid
from datetime import datetime, timedelta, timezone
from decimal import Decimal, InvalidOperation
from typing import Any

import httpx
import sqlalchemy as sa
from flask import current_app

from app.audit.service import record
from app.core import costing
from app.errors import Forbidden, NotFound, ValidationError
from app.extensions import db
from app.contract import budget as rb
from app.finops import rollups, webhooks
from app.finops.models import BUDGET_ACTIONS, AdjustmentRequest, Budget, BudgetAlert, Rollup
from app.ledger.models import OFF_PATH_KINDS, LedgerEntry
from app.models_base import row_id
from app.redis_client import get_redis, keys
from app.tenants.models import Tenant

log = logging.getLogger(__name__)
THRESHOLDS = (50, 80, 100)


def _ns() -> str:
    return current_app.config["REDIS_NAMESPACE"]


def _decimal(value: Any, field: str) -> Decimal:
    try:
        out = Decimal(str(value).strip().replace(",", "").lstrip("$"))
    except (InvalidOperation, AttributeError):
        raise ValidationError(f"{field} must be a number", {field: ["not a number"]}) from None
    if not out.is_finite():
        raise ValidationError(f"{field} must be a number", {field: ["not a number"]})
    return out


def _tenant(tenant_id: Any) -> Tenant:
    rid = row_id(tenant_id)
    tenant = db.session.get(Tenant, rid) if rid is not None else None
    if tenant is None:
        raise NotFound("no such tenant", {"tenant_id": ["unknown tenant"]})
    return tenant


# --- adjustments ----------------------------------------------------------------------

def _check_adjustment(user, tenant_id: Any, amount: Any, reason: str
                      ) -> tuple[Tenant, Decimal, str]:
    tenant = _tenant(tenant_id)
    if user.tenant_id is not None or not user.can("budget.manage", tenant.id):
        raise Forbidden("ledger adjustments are made by central FinOps")
    value = _decimal(amount, "amount")
    reason = (reason or "").strip()
    if value == 0:
        raise ValidationError("an adjustment must not be zero", {"amount": ["is zero"]})
    if not reason:
        raise ValidationError("say why", {"reason": ["required"]})
    return tenant, value, reason


def second_person_threshold() -> Decimal:
    return Decimal(str(current_app.config["FINOPS_ADJUSTMENT_SECOND_PERSON_USD"]))


def record_adjustment(user, tenant_id: int, amount: Any, reason: str
                      ) -> LedgerEntry | AdjustmentRequest:
    """A correction as a new ledger row (kind='adjustment'); the ledger is never edited.
    Counted in the Redis month counter too, so budgets see credits and charges.

    Two-person rule: an amount above ``FINOPS_ADJUSTMENT_SECOND_PERSON_USD`` (either sign)
    is not booked: it becomes a pending ``AdjustmentRequest`` that another central FinOps
    user approves (``decide_adjustment``); that is what is returned then."""
    tenant, value, reason = _check_adjustment(user, tenant_id, amount, reason)
    if abs(value) > second_person_threshold():
        req = AdjustmentRequest(tenant_id=tenant.id, amount_usd=costing.to_ledger(value),
                                reason=reason[:500], requested_by_id=getattr(user, "id", None),
                                requested_by=getattr(user, "email", "system"))
        db.session.add(req)
        db.session.flush()
        record(user, "ledger.adjust_request", "adjustment_request", req.id, tenant_id=tenant.id,
               after={"amount_usd": str(value), "reason": reason[:500]})
        db.session.commit()
        return req
    return _book_adjustment(user, tenant, value, reason)


def _book_adjustment(user, tenant: Tenant, value: Decimal, reason: str,
                     people: tuple[str, str | None] | None = None) -> LedgerEntry:
    """Book the adjustment; ``people`` = (requester, approver) under the two-person rule."""
    now = datetime.now(timezone.utc)
    by = {"by": getattr(user, "email", "system")}
    if people:
        by = {"by": people[0], "approved_by": people[1]}
    row = LedgerEntry(request_id=f"adj_{uuid.uuid4().hex}", kind="adjustment", at=now,
                      tenant_id=tenant.id, tier="", workflow="", model="", status=200,
                      cache="miss", cost_usd=costing.to_ledger(value),
                      baseline_cost_usd=Decimal(0),
                      payload={"adjustment": {"reason": reason[:500], **by}})
    db.session.add(row)
    db.session.flush()
    record(user, "ledger.adjust", "ledger_entry", row.id, tenant_id=tenant.id,
           after={"amount_usd": str(value), "reason": reason[:500],
                  "request_id": row.request_id, **({"requested_by": people[0]}
                                                   if people else {})})
    redis = get_redis()
    with rb.booking_lock(redis, _ns(), hold_s=10, wait_s=15):  # a reconcile sees both
        db.session.commit()
        rb.add_spend(redis, _ns(), tenant.id, value, rb.current_period(now))
    return row


def pending_adjustments(user) -> list[AdjustmentRequest]:
    if user.tenant_id is not None or not user.can("budget.manage"):
        return []
    return list(db.session.scalars(sa.select(AdjustmentRequest).where(
        AdjustmentRequest.state == "pending").order_by(AdjustmentRequest.id)))


def decide_adjustment(user, request_id: Any, approve: bool, comment: str = ""
                      ) -> AdjustmentRequest:
    """The second person's decision on a pending adjustment: approving books it (as the
    ledger row, naming both people), rejecting closes it. The requester cannot decide."""
    rid = row_id(request_id)
    req = db.session.get(AdjustmentRequest, rid) if rid is not None else None
    if req is None:
        raise NotFound("no such adjustment request")
    if user.tenant_id is not None or not user.can("budget.manage", req.tenant_id):
        raise Forbidden("adjustments are approved by central FinOps")
    if req.state != "pending":
        raise ValidationError(f"this adjustment is already {req.state}", {"state": [req.state]})
    if getattr(user, "id", None) is not None and user.id == req.requested_by_id:
        raise Forbidden("two-person rule: the person who asked for an adjustment cannot "
                        "approve or reject it")
    req.state = "approved" if approve else "rejected"
    req.decided_by = getattr(user, "email", "system")
    req.decided_at = datetime.now(timezone.utc)
    req.decision_comment = (comment or "")[:500]
    record(user, f"ledger.adjust_{req.state}", "adjustment_request", req.id,
           tenant_id=req.tenant_id, after={"amount_usd": f"{req.amount_usd:f}",
                                           "comment": req.decision_comment})
    if not approve:
        db.session.commit()
        return req
    row = _book_adjustment(user, _tenant(req.tenant_id), req.amount_usd, req.reason,
                           people=(req.requested_by, req.decided_by))
    req.ledger_request_id = row.request_id
    db.session.commit()
    return req


# --- budgets --------------------------------------------------------------------------

def save_budget(user, tenant_id: Any, monthly_limit_usd: Any, action: str,
                webhook_url: str = "") -> Budget:
    tenant = _tenant(tenant_id)
    if not user.can("budget.manage", tenant.id):
        raise Forbidden("you may not set this tenant's budget")
    limit = _decimal(monthly_limit_usd, "monthly_limit_usd")
    errors: dict[str, list[str]] = {}
    if limit <= 0:
        errors["monthly_limit_usd"] = ["must be above 0"]
    if action not in BUDGET_ACTIONS:
        errors["action"] = [f"one of {', '.join(BUDGET_ACTIONS)}"]
    webhook_url = (webhook_url or "").strip()
    bad = webhook_url and webhooks.problem(
        webhook_url, webhooks.allowed_hosts(current_app.config["WEBHOOK_ALLOWED_HOSTS"]))
    if bad:
        errors["webhook_url"] = [bad]
    if errors:
        raise ValidationError("the budget is not valid", errors)
    row = db.session.scalar(sa.select(Budget).where(Budget.tenant_id == tenant.id))
    if row is not None and user.tenant_id is not None:
        # a budget is a central ceiling: the tenant's own finops may tighten it, not lift it
        loosened = {}
        if limit > row.monthly_limit_usd:
            loosened["monthly_limit_usd"] = [
                f"central bound: at most {costing.format_usd(row.monthly_limit_usd)}"]
        if row.action == "hard_stop" and action != "hard_stop":
            loosened["action"] = ["central bound: a hard stop stays a hard stop"]
        if loosened:
            raise Forbidden("a tenant may tighten its budget, never lift it", loosened)
    before = budget_dict(row) if row else None
    if row is None:
        row = Budget(tenant_id=tenant.id)
        db.session.add(row)
    row.monthly_limit_usd, row.action, row.webhook_url = limit, action, webhook_url
    db.session.flush()
    record(user, "budget.save", "budget", row.id, tenant_id=tenant.id, before=before,
           after=budget_dict(row))
    db.session.commit()
    rb.mirror_limit(get_redis(), _ns(), tenant.id, limit, action, tenant.name)
    return row


def delete_budget(user, tenant_id: Any) -> None:
    tenant = _tenant(tenant_id)
    if not user.can("budget.manage", tenant.id):
        raise Forbidden("you may not remove this tenant's budget")
    if user.tenant_id is not None:
        raise Forbidden("a budget is a central ceiling: only central FinOps removes it")
    row = db.session.scalar(sa.select(Budget).where(Budget.tenant_id == tenant.id))
    if row is None:
        raise NotFound("this tenant has no budget")
    record(user, "budget.delete", "budget", row.id, tenant_id=tenant.id,
           before=budget_dict(row))
    db.session.delete(row)
    db.session.commit()
    rb.mirror_limit(get_redis(), _ns(), tenant.id, None)


def budget_dict(row: Budget) -> dict:
    """A budget as the API answers it and the audit log records it."""
    return {"tenant_id": row.tenant_id, "monthly_limit_usd": f"{row.monthly_limit_usd:f}",
            "action": row.action, "webhook_url": row.webhook_url}


def list_budgets(user, period: str | None = None) -> list[dict[str, Any]]:
    """Budgets the user may see with this month's real-time spend from Redis."""
    period = period or rb.current_period()
    q = sa.select(Budget, Tenant).join(Tenant, Tenant.id == Budget.tenant_id).order_by(Tenant.name)
    if user.tenant_id is not None:
        q = q.where(Budget.tenant_id == user.tenant_id)
    redis, ns, out = get_redis(), _ns(), []
    for row, tenant in db.session.execute(q):
        st = rb.state(redis, ns, tenant.id, period)
        spent = costing.from_micro(st["spent_micro"])
        out.append({"tenant_id": tenant.id, "tenant": tenant.name,
                    "department": tenant.department, "period": period,
                    "monthly_limit_usd": row.monthly_limit_usd, "action": row.action,
                    "webhook_url": row.webhook_url, "spent_usd": spent,
                    "in_flight_usd": costing.from_micro(st["reserved_micro"]),
                    "refusing": st["refused_micro"] is not None,
                    "used_pct": float(spent / row.monthly_limit_usd * 100)
                    if row.monthly_limit_usd else 0.0,
                    "can_manage": user.can("budget.manage", tenant.id),
                    "can_remove": user.tenant_id is None and user.can("budget.manage")})
    return out


def list_alerts(user, limit: int = 50) -> list[dict[str, Any]]:
    q = (sa.select(BudgetAlert, Tenant.name).join(Tenant, Tenant.id == BudgetAlert.tenant_id)
         .order_by(BudgetAlert.at.desc()).limit(limit))
    if user.tenant_id is not None:
        q = q.where(BudgetAlert.tenant_id == user.tenant_id)
    return [{"tenant_id": a.tenant_id, "tenant": name, "period": a.period,
             "threshold_pct": a.threshold_pct, "spent_usd": a.spent_usd,
             "at": a.at, "webhook_status": a.webhook_status}
            for a, name in db.session.execute(q)]


def check_budget_alerts(now: datetime | None = None) -> list[BudgetAlert]:
    """Raise the 50/80/100% alerts crossed this month (from the Redis counters): one row
    per tenant/period/threshold, then POST each new one to the budget's webhook (or
    BUDGET_WEBHOOK_URL). A hard stop's first refusal counts as 100% (it refuses before
    spend reaches the limit, so spend alone would never get there). Returns the new
    alerts."""
    period = rb.current_period(now)
    redis, ns, new = get_redis(), _ns(), []
    for row, tenant in db.session.execute(sa.select(Budget, Tenant).join(
            Tenant, Tenant.id == Budget.tenant_id)):
        st = rb.state(redis, ns, tenant.id, period)
        spent = costing.from_micro(st["spent_micro"])
        used = spent / row.monthly_limit_usd * 100 if row.monthly_limit_usd else 0
        refused = st["refused_micro"] is not None
        for pct in THRESHOLDS:
            if used < pct and not (pct == 100 and refused):
                continue
            alert = _insert_alert(tenant.id, period, pct, spent)
            if alert is not None:
                new.append((alert, row, tenant, refused and used < pct))
    db.session.commit()
    default_url = current_app.config["BUDGET_WEBHOOK_URL"]   # the operator's: trusted
    allowed = webhooks.allowed_hosts(current_app.config["WEBHOOK_ALLOWED_HOSTS"])
    for alert, row, tenant, by_refusal in new:
        url = row.webhook_url or default_url
        bad = row.webhook_url and webhooks.problem(row.webhook_url, allowed)
        if bad:   # checked again now: DNS may have moved since the budget was saved
            alert.webhook_status = f"refused: {bad}"[:64]
        elif url:
            alert.webhook_status = _post_webhook(url, alert, row, tenant, by_refusal)
    db.session.commit()
    return [a for a, _, _, _ in new]


def _insert_alert(tenant_id: int, period: str, pct: int, spent: Decimal) -> BudgetAlert | None:
    exists = db.session.scalar(sa.select(BudgetAlert.id).where(
        BudgetAlert.tenant_id == tenant_id, BudgetAlert.period == period,
        BudgetAlert.threshold_pct == pct))
    if exists is not None:
        return None
    alert = BudgetAlert(tenant_id=tenant_id, period=period, threshold_pct=pct,
                        spent_usd=costing.to_ledger(spent))
    try:
        with db.session.begin_nested():
            db.session.add(alert)
    except sa.exc.IntegrityError:  # another worker raised it first
        return None
    return alert


def _post_webhook(url: str, alert: BudgetAlert, row: Budget, tenant: Tenant,
                  by_refusal: bool = False) -> str:
    """``trigger``: 'spend' (the counter crossed the threshold) or 'refused' (a hard stop
    refused a request whose estimate would have passed the limit)."""
    payload = {"event": "budget.threshold", "tenant_id": tenant.id, "tenant": tenant.name,
               "department": tenant.department, "period": alert.period,
               "threshold_pct": alert.threshold_pct, "spent_usd": costing.format_usd(alert.spent_usd, grouped=False, symbol=False),
               "monthly_limit_usd": costing.format_usd(row.monthly_limit_usd, grouped=False,
                                                       symbol=False),
               "action": row.action, "trigger": "refused" if by_refusal else "spend"}
    try:
        resp = httpx.post(url, json=payload, timeout=5.0)
        return f"{resp.status_code}"
    except httpx.HTTPError as exc:
        log.warning("budget webhook %s failed: %s", url, exc)
        return f"error: {type(exc).__name__}"[:64]


def ledger_month_spend(period: str) -> dict[int, Decimal]:
    start, end = rollups.month_range(period)
    rows = db.session.execute(sa.select(LedgerEntry.tenant_id, sa.func.sum(LedgerEntry.cost_usd))
                              .where(LedgerEntry.at >= start, LedgerEntry.at < end,
                                     # off-path runs are never on a tenant's budget
                                     LedgerEntry.kind.not_in(OFF_PATH_KINDS))
                              .group_by(LedgerEntry.tenant_id))
    return {t: Decimal(s or 0) for t, s in rows}


def _gpu_true_up(period: str) -> dict[int, Decimal]:
    """Per tenant: GPU-hour allocation minus the per-token estimates it replaced, over the
    month's rolled-up hours (app.finops.rollups): what turns booked pool estimates into
    the pool's real cost."""
    start, end = rollups.month_range(period)
    rows = db.session.execute(
        sa.select(Rollup.tenant_id,
                  sa.func.sum(Rollup.gpu_cost_usd - Rollup.pool_estimate_usd))
        .where(Rollup.grain == "hour", Rollup.bucket_start >= start, Rollup.bucket_start < end,
               Rollup.tenant_id != 0)
        .group_by(Rollup.tenant_id))
    return {t: Decimal(s or 0) for t, s in rows}


def _in_ledger(request_ids: list[str]) -> list[str]:
    found: list[str] = []
    for i in range(0, len(request_ids), 1000):
        found += db.session.scalars(sa.select(LedgerEntry.request_id).where(
            LedgerEntry.request_id.in_(request_ids[i:i + 1000])))
    return found


def reconcile_budget_counters(period: str | None = None) -> list[dict[str, Any]]:
    """Set each budgeted tenant's Redis month counter to its spend by the ledger (booked
    costs, pool estimates replaced by their GPU-hour allocation where rolled up) plus
    what gateways counted that the drain has not committed yet. Corrects down as well as
    up; holds the booking lock so no batch commits between the SQL sum and the Redis
    write, and leaves in-flight reservations alone. A no-op when nothing drifted."""
    period = period or rb.current_period()
    redis, ns, out = get_redis(), _ns(), []
    tenants = list(db.session.scalars(sa.select(Budget.tenant_id)))
    db.session.commit()  # the sums below read what is committed from here on
    with rb.booking_lock(redis, ns, hold_s=120, wait_s=60):
        spend = ledger_month_spend(period)
        true_up = _gpu_true_up(period)
        for tenant_id in tenants:
            booked = _in_ledger(rb.unbooked_ids(redis, ns, tenant_id))
            target = spend.get(tenant_id, Decimal(0)) + true_up.get(tenant_id, Decimal(0))
            before, after, pending = rb.correct_spent(redis, ns, tenant_id, period, target,
                                                      booked)
            out.append({"tenant_id": tenant_id, "before_micro": before, "after_micro": after,
                        "undrained_micro": pending})
        db.session.commit()
    return out


def mirror_budgets() -> int:
    """Publish every budget to Redis (run at period start and after a Redis loss)."""
    redis, ns, n = get_redis(), _ns(), 0
    for row, tenant in db.session.execute(sa.select(Budget, Tenant).join(
            Tenant, Tenant.id == Budget.tenant_id)):
        rb.mirror_limit(redis, ns, tenant.id, row.monthly_limit_usd, row.action, tenant.name)
        redis.set(rb.spent_key(ns, tenant.id, rb.current_period()), 0, nx=True,
                  ex=rb.COUNTER_TTL_S)
        n += 1
    return n


# --- rollup runs ----------------------------------------------------------------------

def run_rollups() -> dict[str, str]:
    """Rebuild the buckets touched by ledger rows that arrived since the last run."""
    redis = get_redis()
    key = keys().rollup_watermark()
    mark = int(redis.get(key) or 0)
    since = datetime.now(timezone.utc) - timedelta(hours=2)
    new_mark, counts = rollups.rebuild_new(mark, since)
    if new_mark != mark:
        redis.set(key, new_mark)
    redis.set(keys().rollup_ran_at(), f"{time.time():.3f}")
    return counts


def figures_as_of() -> datetime | None:
    """When the rollups last ran (FinOps pages are as of then); None if never."""
    try:
        raw = get_redis().get(keys().rollup_ran_at())
    except Exception:  # noqa: BLE001 - Redis down: the page says "unknown"
        return None
    return datetime.fromtimestamp(float(raw), tz=timezone.utc) if raw else None
