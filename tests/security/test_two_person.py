"""Security finding 5, second part: a ledger adjustment above the threshold needs a second
person. It waits, books nothing and moves no budget until another central FinOps user
approves it (then it is one ledger row naming both); the requester cannot decide it."""
from __future__ import annotations

from decimal import Decimal

import pytest
import sqlalchemy as sa

from app.audit.models import AuditLog
from app.contract import budget as rb
from app.errors import Forbidden, ValidationError
from app.extensions import db
from app.finops import service
from app.finops.models import AdjustmentRequest
from app.ledger.models import LedgerEntry
from app.redis_client import get_redis, keys
from tests.console.web import browser, csrf_from, login
from tests.factories import TenantFactory, UserFactory


def _ledger(tenant_id: int) -> list[LedgerEntry]:
    db.session.expire_all()
    return list(db.session.scalars(sa.select(LedgerEntry).where(
        LedgerEntry.tenant_id == tenant_id, LedgerEntry.kind == "adjustment")))


def _spent(tenant_id: int) -> int:
    return rb.state(get_redis(), keys().ns, tenant_id, rb.current_period())["spent_micro"]


def test_a_large_credit_waits_for_a_second_person(app):
    tenant = TenantFactory()
    alice, bob = UserFactory(role="finops"), UserFactory(role="finops")
    small = service.record_adjustment(alice, tenant.id, "-99.99", "goodwill")
    assert isinstance(small, LedgerEntry)                      # at or under $100: booked
    req = service.record_adjustment(alice, tenant.id, "-1000000", "free money?")
    assert isinstance(req, AdjustmentRequest) and req.state == "pending"
    assert [r.cost_usd for r in _ledger(tenant.id)] == [Decimal("-99.99")]
    assert _spent(tenant.id) == -99_990_000                   # the big one moved nothing
    with pytest.raises(Forbidden, match="two-person rule"):
        service.decide_adjustment(alice, req.id, True)
    with pytest.raises(Forbidden):                             # a tenant's finops: no
        service.decide_adjustment(UserFactory(role="finops", tenant=tenant), req.id, True)
    done = service.decide_adjustment(bob, req.id, True, "checked the contract")
    assert done.state == "approved" and done.decided_by == bob.email
    rows = _ledger(tenant.id)
    big = next(r for r in rows if r.request_id == done.ledger_request_id)
    assert big.cost_usd == Decimal("-1000000")
    assert big.payload["adjustment"] == {"reason": "free money?", "by": alice.email,
                                         "approved_by": bob.email}
    assert _spent(tenant.id) == -99_990_000 - 1_000_000_000_000
    actions = set(db.session.scalars(sa.select(AuditLog.action).where(
        AuditLog.tenant_id == tenant.id)))
    assert {"ledger.adjust_request", "ledger.adjust_approved", "ledger.adjust"} <= actions
    with pytest.raises(ValidationError, match="already approved"):
        service.decide_adjustment(UserFactory(role="admin"), req.id, False)


def test_a_rejected_request_books_nothing(app):
    tenant = TenantFactory()
    alice, bob = UserFactory(role="finops"), UserFactory(role="admin")
    req = service.record_adjustment(alice, tenant.id, "250", "late GPU invoice")
    assert service.decide_adjustment(bob, req.id, False, "wrong tenant").state == "rejected"
    assert _ledger(tenant.id) == [] and _spent(tenant.id) == 0


def test_the_showback_page_lists_it_and_only_the_other_person_may_decide(app):
    tenant = TenantFactory(name="acme")
    alice, bob = UserFactory(role="finops"), UserFactory(role="finops")
    web_a, web_b = browser(app), browser(app)
    login(web_a, alice.email)
    login(web_b, bob.email)
    page = web_a.get("/finops/showback").get_data(as_text=True)
    resp = web_a.post("/finops/adjustments", data={"csrf_token": csrf_from(page),
                                                   "tenant_id": tenant.id, "amount": "-5000",
                                                   "reason": "outage credit"})
    assert resp.status_code == 302
    mine = web_a.get("/finops/showback").get_data(as_text=True)
    assert "needs a second person" in mine and "another FinOps user decides" in mine
    theirs = web_b.get("/finops/showback").get_data(as_text=True)
    row = theirs.split('id="pending-adjustments"', 1)[1].split("</table>", 1)[0]
    assert "acme" in row and "-$5,000.00" in row and "Approve" in row
    (req,) = service.pending_adjustments(bob)
    resp = web_b.post(f"/finops/adjustments/requests/{req.id}/approve",
                      data={"csrf_token": csrf_from(theirs)})
    assert resp.status_code == 302
    assert [r.cost_usd for r in _ledger(tenant.id)] == [Decimal("-5000")]
    assert web_a.post(f"/finops/adjustments/requests/{req.id}/reject",
                      data={"csrf_token": csrf_from(mine)}).status_code == 422


def test_the_api_accepts_a_large_adjustment_as_pending_and_a_second_token_decides(app):
    from app.auth.service import create_admin_token
    tenant = TenantFactory()
    alice, bob = UserFactory(role="finops"), UserFactory(role="finops")
    api = app.test_client()
    ha = {"Authorization": f"Bearer {create_admin_token(alice, 't')[1]}"}
    hb = {"Authorization": f"Bearer {create_admin_token(bob, 't')[1]}"}
    resp = api.post("/api/v1/finops/adjustments", headers=ha,
                    json={"tenant_id": tenant.id, "amount": "150", "reason": "GPU invoice"})
    assert resp.status_code == 202 and resp.json["pending"]["state"] == "pending"
    rid = resp.json["pending"]["id"]
    assert api.post(f"/api/v1/finops/adjustments/requests/{rid}/approve", headers=ha,
                    json={}).status_code == 403
    listed = api.get("/api/v1/finops/adjustments/requests", headers=hb).json["pending"]
    assert [p["id"] for p in listed] == [rid]
    done = api.post(f"/api/v1/finops/adjustments/requests/{rid}/approve", headers=hb,
                    json={"comment": "ok"})
    assert done.status_code == 200 and done.json["state"] == "approved"
    assert [r.cost_usd for r in _ledger(tenant.id)] == [Decimal("150")]
