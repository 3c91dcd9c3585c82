"""The canary watch (task ``adapters.canary_watch``): a serving adapter whose live traffic
shows a regression with 95% confidence is rolled back by the system, with the figures on
its timeline and in the audit log; noise and traffic from before it served roll nothing
back."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone
from decimal import Decimal

from app.adapters import rollout, watch
from app.audit.models import AuditLog
from app.extensions import db
from app.ledger.models import LedgerEntry
from app.policies.models import Policy
from tests.adapters.conftest import queued_lora, reload
from tests.factories import UserFactory


def _approved(make_adapter, tenant, **cols):
    """An adapter a requester trained and an approver approved: canary at 5%."""
    requester = UserFactory(role="ops")
    adapter = make_adapter(tenant, "awaiting_approval", requester=requester, **cols)
    rollout.approve(UserFactory(role="approver"), adapter.id, "evidence looks good")
    return reload(adapter.id)


def _answers(adapter, n: int, *, errors: int = 0, passed: int | None = None,
             failed: int = 0, at: datetime | None = None, tag: str = "") -> None:
    """``n`` ledger requests the adapter answered: ``errors`` of them with status 502, and
    feedback verdicts on ``passed`` + ``failed`` of the others."""
    at = at or datetime.now(timezone.utc)
    rows = []
    for i in range(n):
        payload = {}
        if i >= errors:
            k = i - errors
            if passed is not None and k < passed:
                payload = {"feedback": {"pass": True}}
            elif passed is not None and k < passed + failed:
                payload = {"feedback": {"pass": False}}
        rows.append(LedgerEntry(request_id=f"req_{adapter.name}{tag}_{i}", tenant_id=adapter.tenant_id,
                                workflow=adapter.workflow, tier="tier-1", adapter=adapter.name,
                                status=502 if i < errors else 200, at=at,
                                cost_usd=Decimal("0.00001"), payload=payload))
    db.session.add_all(rows)
    db.session.commit()


def test_error_rate_regression_rolls_the_canary_back(app, make_adapter, two_tenants,
                                                    redis_client):
    adapter = _approved(make_adapter, two_tenants[0])
    _answers(adapter, 60, errors=12)        # 20%; the 95% low bound is ~12%, above 2%
    (line,) = watch.canary_watch()
    assert line["rolled_back"] and "error rate 20.0% over 60 answers" in line["why"]
    after = reload(adapter.id)
    assert (after.state, after.canary_pct) == ("rolled_back", 0)
    assert after.live["errors"] == 12 and after.live["answers"] == 60
    last = after.events[-1]
    assert (last.event, last.actor_email) == ("rollback", "system")
    assert last.comment.startswith("automatic rollback: error rate 20.0%")
    assert db.session.scalar(db.select(AuditLog).where(
        AuditLog.action == "adapter.rollback", AuditLog.entity_id == str(adapter.id),
        AuditLog.actor_email == "system")) is not None
    assert ("adapters.unload", f"[{adapter.id}]") in queued_lora(redis_client)


def test_failing_feedback_rolls_a_promoted_adapter_back_and_restores_the_previous(
        app, make_adapter, two_tenants, redis_client):
    acme = two_tenants[0]
    old = make_adapter(acme, "retired", workflow="wf-fb", canary_pct=0)
    new = make_adapter(acme, "promoted", workflow="wf-fb", previous_adapter_id=old.id)
    # promoted: its live record starts at its approval
    db.session.add(_event(new, "approve"))
    db.session.commit()
    _answers(new, 30, passed=18, failed=12)    # 60% pass; high bound ~76%, below 95%
    (line,) = watch.canary_watch()
    assert line["rolled_back"] and "pass rate 60.0% over 30 verdicts" in line["why"]
    assert reload(new.id).state == "rolled_back"
    assert (reload(old.id).state, reload(old.id).canary_pct) == ("promoted", 100)
    queued = queued_lora(redis_client)
    assert ("adapters.unload", f"[{new.id}]") in queued
    assert ("adapters.load", f"[{old.id}]") in queued


def _event(adapter, event: str, at: datetime | None = None):
    from app.adapters.models import AdapterEvent
    return AdapterEvent(adapter_id=adapter.id, actor_email="approver@example.com", event=event,
                        from_state="awaiting_approval", to_state="canary",
                        at=at or datetime.now(timezone.utc) - timedelta(seconds=1))


def test_noise_and_too_little_evidence_roll_nothing_back(app, make_adapter, two_tenants):
    acme, globex = two_tenants
    few = _approved(make_adapter, acme)
    _answers(few, 10, errors=5)              # 50% errors, but 10 answers < 50 needed
    noisy = _approved(make_adapter, globex)
    _answers(noisy, 100, errors=3, passed=19, failed=1)   # 3% errors: low bound ~1% < 2%
    lines = {line["id"]: line for line in watch.canary_watch()}
    assert not lines[few.id]["rolled_back"] and not lines[noisy.id]["rolled_back"]
    assert reload(few.id).state == reload(noisy.id).state == "canary"
    assert reload(noisy.id).live["pass_rate"] == 0.95
    assert reload(noisy.id).live["verdicts"] == 20


def test_a_tenants_policy_sets_the_bar(app, make_adapter, two_tenants):
    acme = two_tenants[0]
    db.session.add(Policy(tenant_id=acme.id, values={"canary_max_error_rate": 0.5}))
    db.session.commit()
    adapter = _approved(make_adapter, acme)
    _answers(adapter, 60, errors=12)         # 20% errors: tolerated under a 50% bar
    (line,) = watch.canary_watch()
    assert not line["rolled_back"] and reload(adapter.id).state == "canary"


def test_answers_from_before_it_served_do_not_count(app, make_adapter, two_tenants):
    adapter = _approved(make_adapter, two_tenants[0])
    # an earlier run of the same name: all errors, a day before this approval
    _answers(adapter, 60, errors=60, at=datetime.now(timezone.utc) - timedelta(days=1),
             tag="old")
    _answers(adapter, 60)
    (line,) = watch.canary_watch()
    assert not line["rolled_back"] and line["answers"] == 60 and line["errors"] == 0


def test_the_watch_is_a_scheduled_task(app):
    from workers.tasks import adapters as tasks
    celery = app.extensions["celery"]
    assert tasks.canary_watch.name == "adapters.canary_watch"
    assert "adapters.canary_watch" in set(celery.tasks)
    schedule = celery.conf.beat_schedule
    assert schedule["adapters-canary-watch"]["task"] == "adapters.canary_watch"
