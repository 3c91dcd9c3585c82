"""FinOps tasks: thin wrappers that call one service function each."""
from celery import shared_task


@shared_task(name="finops.rollup")
def rollup() -> dict:
    """Rebuild the rollup buckets touched by new ledger rows (and the last two hours)."""
    from app.finops.service import run_rollups
    return run_rollups()


@shared_task(name="finops.check_budgets")
def check_budgets() -> int:
    """Raise 50/80/100% budget alerts from the real-time counters; returns new alerts."""
    from app.finops.service import check_budget_alerts
    return len(check_budget_alerts())


@shared_task(name="finops.reconcile_budgets")
def reconcile_budgets() -> list:
    """Set this month's Redis spend counters from the ledger (plus what is counted but
    not drained yet), down as well as up."""
    from app.finops.service import reconcile_budget_counters
    return reconcile_budget_counters()


@shared_task(name="finops.reset_budgets")
def reset_budgets() -> int:
    """At period start: the month is in the counter key, so the new month is already at
    zero; this re-publishes every limit and creates the month's counters."""
    from app.finops.service import mirror_budgets
    return mirror_budgets()


@shared_task(name="finops.reap_holds")
def reap_holds() -> dict:
    """Give back the budget holds of gateway instances whose heartbeat is gone (killed
    gateways) and of holds past their lease deadline."""
    from app.contract import leases
    from app.redis_client import get_redis, keys
    return leases.reap(get_redis(), keys())
