"""Security finding 8 (workflows): every new X-Sluice-Workflow value became a workflow,
and every workflow is in every gateway's snapshot (50,000 values: an 18.5 MB snapshot,
1.6 s to build, 270 ms stalls on reload). A tenant gets at most WORKFLOWS_PER_TENANT_MAX
workflows; traffic past that is counted under "other", and no request is lost."""
from __future__ import annotations

from app.extensions import db
from app.ledger.models import LedgerEntry
from app.ledger.service import drain_stream
from app.snapshot.service import build_snapshot
from app.workflows.models import Workflow
from tests.factories import TenantFactory
from tests.ledger.test_drain import event, push


def test_invented_workflow_names_stop_at_the_cap(app, redis_client, monkeypatch):
    monkeypatch.setitem(app.config, "WORKFLOWS_PER_TENANT_MAX", 3)
    tenant = TenantFactory()
    push(redis_client, [event(tenant.id, i, workflow=f"invented-{i}") for i in range(12)])
    drain_stream(max_batches=10)
    sigs = set(db.session.scalars(db.select(Workflow.signature).where(
        Workflow.tenant_id == tenant.id)))
    assert len(sigs - {"other"}) == 3 and "other" in sigs
    rows = list(db.session.scalars(db.select(LedgerEntry).where(
        LedgerEntry.tenant_id == tenant.id)))
    assert len(rows) == 12                                  # nothing lost
    assert sum(r.workflow == "other" for r in rows) == 9
    snap = build_snapshot()["workflows"]
    assert len([k for k in snap if k.startswith(f"{tenant.id}:")]) == 4
    # a known workflow keeps booking under its own name
    push(redis_client, [event(tenant.id, 100, workflow=sorted(sigs - {"other"})[0])])
    drain_stream(max_batches=10)
    db.session.expire_all()
    last = db.session.scalar(db.select(LedgerEntry).where(
        LedgerEntry.request_id == event(tenant.id, 100)["request_id"]))
    assert last.workflow != "other"
