"""Audit log page and workflows."""
from app.audit.models import AuditLog
from app.extensions import db
from app.workflows.models import Workflow
from app.workflows.service import ensure_workflow
from tests.console.web import submit
from tests.factories import TenantFactory


def test_audit_log_filters_by_action(client, admin):
    submit(client, "/tenants/new", {"name": "alpha", "status": "active"})
    tenant = db.session.scalar(db.select(AuditLog)).tenant_id
    submit(client, f"/tenants/{tenant}/keys", {"name": "bot"})
    html = client.get("/audit").get_data(as_text=True)
    assert "tenant.create" in html and "key.create" in html
    html = client.get("/audit?action=key.create").get_data(as_text=True)
    assert "<code>key.create</code>" in html and "<code>tenant.create</code>" not in html


def test_workflow_rename_and_cohort_with_audit(client, admin):
    tenant = TenantFactory(name="alpha")
    wf = ensure_workflow(tenant.id, "a" * 64)
    assert "(unnamed)" in client.get("/workflows").get_data(as_text=True)
    resp = submit(client, f"/workflows/{wf.id}/edit", {"name": "invoice extraction",
                                                       "category": "structured_extraction"})
    assert resp.status_code == 302
    db.session.expire_all()
    wf = db.session.get(Workflow, wf.id)
    assert (wf.name, wf.category) == ("invoice extraction", "structured_extraction")
    row = db.session.scalar(db.select(AuditLog).where(AuditLog.action == "workflow.update"))
    assert row.before["category"] == "uncategorized"
    resp = submit(client, f"/workflows/{wf.id}/edit", {"name": "x", "category": "poetry"})
    assert resp.status_code == 422 and "must be one of" in resp.get_data(as_text=True)
    db.session.expire_all()
    assert db.session.get(Workflow, wf.id).category == "structured_extraction"


def test_scoped_user_sees_only_own_workflows(client, as_role):
    alpha, bravo = TenantFactory(name="alpha"), TenantFactory(name="bravo")
    mine = ensure_workflow(alpha.id, "m" * 64, "mine")
    theirs = ensure_workflow(bravo.id, "t" * 64, "theirs")
    as_role("ops", tenant=alpha)
    html = client.get("/workflows").get_data(as_text=True)
    assert "mine" in html and "theirs" not in html
    assert client.get(f"/workflows/{theirs.id}/edit").status_code == 404
    assert client.get(f"/workflows/{mine.id}/edit").status_code == 200


def test_workflows_say_which_are_in_their_frontier_warm_up(client, admin):
    from datetime import datetime, timedelta, timezone

    from app.extensions import db
    from app.policies.models import Policy
    from app.workflows.service import ensure_workflow
    tenant = TenantFactory(name="alpha")
    db.session.add(Policy(tenant_id=tenant.id, values={"frontier_first_hours": 24}))
    fresh = ensure_workflow(tenant.id, "sig-fresh")
    old = ensure_workflow(tenant.id, "sig-old")
    old.first_seen_at = datetime.now(timezone.utc) - timedelta(hours=25)
    db.session.commit()
    html = client.get("/workflows").get_data(as_text=True)
    rows = {sig: html.split(f"<code>{sig[:12]}</code>", 1)[1].split("</tr>", 1)[0]
            for sig in ("sig-fresh", "sig-old")}
    until = (fresh.first_seen_at.replace(tzinfo=timezone.utc) + timedelta(hours=24))
    assert f"warm-up: frontier until {until:%Y-%m-%d %H:%M} UTC" in rows["sig-fresh"]
    assert "warm-up" not in rows["sig-old"] and "router" in rows["sig-old"]


def test_workflows_show_what_tool_retrieval_learned(client, admin, app):
    """The Learned column counts the shared memory's conversations per workflow (what every
    gateway process learned), a dash where it learned nothing."""
    import numpy as np

    from app.contract.keys import Keys
    from app.gateway.workflow_memory import SharedWorkflowMemory, memory_client
    tenant = TenantFactory(name="alpha")
    busy = ensure_workflow(tenant.id, "sig-agent")
    ensure_workflow(tenant.id, "sig-quiet")
    db.session.commit()
    memory = SharedWorkflowMemory(memory_client(app.config["REDIS_URL"]),
                                  Keys(app.config["REDIS_NAMESPACE"]))
    try:
        for i in range(3):
            memory.learn((tenant.id, busy.signature), f"question {i}",
                         np.ones(4, dtype=np.float32) / 2, ["get_weather"])
    finally:
        memory.redis.close()
    html = client.get("/workflows").get_data(as_text=True)
    cells = {sig: html.split(f"<code>{sig[:12]}</code>", 1)[1].split("</tr>", 1)[0]
             for sig in ("sig-agent", "sig-quiet")}
    assert '<td class="num">3</td>' in cells["sig-agent"]
    assert cells["sig-quiet"].count("—") == 3   # no tool tokens, none saved, none learned
