import pytest

from app.audit.models import AuditLog
from app.errors import Forbidden, NotFound, ValidationError
from app.extensions import db
from app.workflows.models import Workflow
from app.workflows.service import ensure_workflow, list_workflows, update_workflow
from tests.factories import TenantFactory, UserFactory


def test_ensure_workflow_is_idempotent(app):
    t = TenantFactory()
    a = ensure_workflow(t.id, "sig1", name="invoices")
    b = ensure_workflow(t.id, "sig1", name="other")
    assert a.id == b.id and b.name == "invoices"
    assert db.session.scalar(db.select(db.func.count()).select_from(Workflow)) == 1


def test_list_is_tenant_scoped(app):
    t1, t2 = TenantFactory(), TenantFactory()
    ensure_workflow(t1.id, "a")
    ensure_workflow(t2.id, "b")
    scoped = UserFactory(role="ops", tenant=t1)
    admin = UserFactory(role="admin")
    assert [w.signature for w in list_workflows(scoped)] == ["a"]
    assert {w.signature for w in list_workflows(admin)} == {"a", "b"}


def test_update_validates_and_audits(app):
    t1, t2 = TenantFactory(), TenantFactory()
    wf = ensure_workflow(t1.id, "a")
    other = ensure_workflow(t2.id, "b")
    ops = UserFactory(role="ops", tenant=t1)
    with pytest.raises(ValidationError) as exc:
        update_workflow(ops, wf.id, {"category": "nonsense"})
    assert "category" in exc.value.errors
    update_workflow(ops, wf.id, {"name": "Invoices", "category": "structured_extraction"})
    db.session.expire_all()
    assert db.session.get(Workflow, wf.id).category == "structured_extraction"
    log = db.session.scalar(db.select(AuditLog).where(AuditLog.action == "workflow.update"))
    assert log.before["name"] == "" and log.after["name"] == "Invoices"
    with pytest.raises(NotFound):
        update_workflow(ops, other.id, {"name": "x"})
    with pytest.raises(Forbidden):
        update_workflow(UserFactory(role="viewer"), wf.id, {"name": "x"})
