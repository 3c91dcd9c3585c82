"""Who may do what to adapters: approvers approve (never their own request), tenant-scoped
users see and act on their tenant only, viewers look; every change is audited and on the
timeline; canary steps supersede and rollback restores the promoted adapter. Ends with a
walk of every adapters route for every role, global and tenant-scoped."""
from __future__ import annotations

import pytest

from app.adapters.models import AdapterEvent
from app.audit.models import AuditLog
from app.extensions import db
from tests.adapters.conftest import queued_lora, reload
from tests.console.web import submit
from tests.factories import UserFactory

ROLES = ("admin", "ops", "finops", "approver", "viewer")
APPROVERS = {"admin", "approver"}
ROLLBACKERS = {"admin", "ops", "approver"}
TRAINERS = {"admin", "ops"}


def _act(web, adapter, event: str, comment: str = "looks right"):
    """Press ``event``'s button (the CSRF token from the list page, which every role sees,
    so a POST about an adapter the user may not see is still a well-formed one)."""
    return submit(web, "/adapters", {"comment": comment},
                  action=f"/adapters/{adapter.id}/{event}")


@pytest.mark.parametrize("role, allowed", [(r, r in APPROVERS) for r in ROLES])
def test_only_approvers_and_admins_approve(app, make_adapter, sign_in, two_tenants, role,
                                           allowed):
    adapter = make_adapter(two_tenants[0], "awaiting_approval",
                           requester=UserFactory(role="ops"))
    web, _ = sign_in(role)
    resp = _act(web, adapter, "approve")
    assert resp.status_code == (302 if allowed else 403)
    assert reload(adapter.id).state == ("canary" if allowed else "awaiting_approval")


@pytest.mark.parametrize("role", ["admin", "approver"])
def test_the_requester_cannot_approve_their_own_adapter(app, make_adapter, sign_in,
                                                        two_tenants, role, api_as):
    web, me = sign_in(role)
    adapter = make_adapter(two_tenants[0], "awaiting_approval", requester=me)
    html = web.get(f"/adapters/{adapter.id}").get_data(as_text=True)
    assert ">Approve<" not in html and ">Reject<" in html
    assert _act(web, adapter, "approve").status_code == 403
    client, hdr = api_as(me)
    resp = client.post(f"/api/v1/adapters/{adapter.id}/approve", headers=hdr,
                       json={"comment": "mine, but fine"})
    assert resp.status_code == 403 and "four eyes" in resp.get_json()["error"]["message"]
    assert reload(adapter.id).state == "awaiting_approval"
    other, _ = sign_in(role)
    assert _act(other, adapter, "approve").status_code == 302
    assert reload(adapter.id).state == "canary"


def test_tenant_scoped_users_see_and_act_on_their_tenant_only(app, make_adapter, sign_in,
                                                              two_tenants, api_as):
    acme, globex = two_tenants
    mine = make_adapter(acme, "awaiting_approval", workflow_name="acme-orders")
    theirs = make_adapter(globex, "awaiting_approval", workflow_name="globex-orders")
    web, approver = sign_in("approver", tenant=acme)
    html = web.get("/adapters").get_data(as_text=True)
    assert "acme-orders" in html and "globex-orders" not in html
    assert web.get(f"/adapters/{theirs.id}").status_code == 404
    assert _act(web, theirs, "approve").status_code == 404
    page = web.get(f"/adapters/{mine.id}")
    assert page.status_code == 200 and ">Approve<" in page.get_data(as_text=True)
    client, hdr = api_as(approver)
    listed = client.get("/api/v1/adapters", headers=hdr).get_json()["adapters"]
    assert [a["id"] for a in listed] == [mine.id]
    assert client.get(f"/api/v1/adapters?tenant_id={globex.id}",
                      headers=hdr).get_json()["adapters"] == []
    assert client.get(f"/api/v1/adapters/{theirs.id}", headers=hdr).status_code == 404
    resp = client.post(f"/api/v1/adapters/{theirs.id}/approve", headers=hdr,
                       json={"comment": "not mine"})
    assert resp.status_code == 404 and reload(theirs.id).state == "awaiting_approval"
    resp = client.post(f"/api/v1/adapters/{mine.id}/approve", headers=hdr,
                       json={"comment": "mine"})
    assert resp.status_code == 200 and reload(mine.id).state == "canary"


def test_viewers_see_the_evidence_but_cannot_act(app, make_adapter, sign_in, two_tenants,
                                                 api_as):
    adapter = make_adapter(two_tenants[0], "canary", offline={"concordance": 0.93})
    web, viewer = sign_in("viewer")
    html = web.get(f"/adapters/{adapter.id}").get_data(as_text=True)
    assert "93.0%" in html and 'id="actions"' not in html
    assert 'method="post" action="/adapters/' not in html   # no button, no train form
    for event in ("advance", "promote", "rollback"):
        assert _act(web, adapter, event).status_code == 403, event
    client, hdr = api_as(viewer)
    got = client.get(f"/api/v1/adapters/{adapter.id}", headers=hdr).get_json()["adapter"]
    assert got["allowed_events"] == []
    assert client.post(f"/api/v1/adapters/{adapter.id}/rollback", headers=hdr,
                       json={}).status_code == 403
    assert reload(adapter.id).state == "canary" and reload(adapter.id).canary_pct == 5


# (state the adapter starts in, event, state it ends in, role that may send it)
TRANSITIONS = [("awaiting_approval", "approve", "canary", "approver"),
               ("awaiting_approval", "reject", "rejected", "approver"),
               ("canary", "advance", "canary", "approver"),
               ("canary", "promote", "promoted", "approver"),
               ("canary", "rollback", "rolled_back", "ops"),
               ("promoted", "rollback", "rolled_back", "approver"),
               ("candidate", "shadow", "shadow", "ops"),
               ("shadow", "submit", "awaiting_approval", "ops"),
               ("candidate", "retire", "retired", "admin"),
               ("training", "cancel", "cancelled", "ops")]


@pytest.mark.parametrize("start, event, end, role", TRANSITIONS)
def test_every_transition_is_audited_and_on_the_timeline(app, make_adapter, sign_in,
                                                         two_tenants, start, event, end, role):
    adapter = make_adapter(two_tenants[0], start)
    web, user = sign_in(role)
    assert _act(web, adapter, event, comment=f"why {event}").status_code == 302
    assert reload(adapter.id).state == end
    audit = db.session.scalars(db.select(AuditLog).where(
        AuditLog.action == f"adapter.{event}", AuditLog.entity_id == str(adapter.id))).all()
    assert [(a.actor_email, a.tenant_id, a.before["state"], a.after["state"])
            for a in audit] == [(user.email, two_tenants[0].id, start, end)]
    events = db.session.scalars(db.select(AdapterEvent).where(
        AdapterEvent.adapter_id == adapter.id)).all()
    assert [(e.event, e.actor_email, e.from_state, e.to_state, e.comment) for e in events] \
        == [(event, user.email, start, end, f"why {event}")]
    timeline = web.get(f"/adapters/{adapter.id}").get_data(as_text=True).split(
        'id="timeline"', 1)[1]
    assert f"why {event}" in timeline and user.email in timeline


def test_canary_steps_5_25_then_promote_at_100_supersede_the_promoted_one(
        app, make_adapter, sign_in, two_tenants, redis_client):
    acme = two_tenants[0]
    old = make_adapter(acme, "promoted", workflow="wf-orders")
    new = make_adapter(acme, "awaiting_approval", workflow="wf-orders")
    web, _ = sign_in("approver")
    _act(web, new, "approve")
    assert (reload(new.id).state, reload(new.id).canary_pct) == ("canary", 5)
    assert reload(new.id).previous_adapter_id == old.id
    _act(web, new, "advance")
    assert (reload(new.id).state, reload(new.id).canary_pct) == ("canary", 25)
    assert reload(old.id).state == "promoted"          # still serves the other 75%
    _act(web, new, "advance")                           # the last step promotes
    assert (reload(new.id).state, reload(new.id).canary_pct) == ("promoted", 100)
    assert reload(old.id).state == "retired"
    assert [(e.event, e.actor_email) for e in reload(old.id).events] == [
        ("supersede", "system")]
    assert ("adapters.unload", f"[{old.id}]") in queued_lora(redis_client)
    html = web.get(f"/adapters/{new.id}").get_data(as_text=True)
    assert "canary → promoted (100%)" in html and ">Roll back<" in html


def test_rollback_from_promoted_restores_the_superseded_adapter(app, make_adapter, sign_in,
                                                                two_tenants, redis_client):
    acme = two_tenants[0]
    old = make_adapter(acme, "retired", workflow="wf-orders", canary_pct=0)
    new = make_adapter(acme, "promoted", workflow="wf-orders", previous_adapter_id=old.id)
    web, ops = sign_in("ops")
    assert _act(web, new, "rollback", comment="complaints from acme").status_code == 302
    assert reload(new.id).state == "rolled_back" and reload(new.id).canary_pct == 0
    assert (reload(old.id).state, reload(old.id).canary_pct) == ("promoted", 100)
    assert [e.event for e in reload(old.id).events] == ["restore"]
    assert db.session.scalar(db.select(AuditLog).where(
        AuditLog.action == "adapter.restore", AuditLog.entity_id == str(old.id))) is not None
    queued = queued_lora(redis_client)
    assert ("adapters.unload", f"[{new.id}]") in queued
    assert ("adapters.load", f"[{old.id}]") in queued
    assert "is now rolled back" in web.get(f"/adapters/{new.id}").get_data(as_text=True)


# -- the route x role walk ---------------------------------------------------------------
def _expected(role: str, scoped: bool, own: bool) -> dict[str, int]:
    """What each route answers ``role`` (global or scoped to the own tenant), for an
    adapter of the own tenant or of another."""
    if scoped and not own:
        hidden = {k: 404 for k in ("detail", "approve", "rollback", "retire", "cancel",
                                   "api_detail", "api_approve")}
        return {"list": 200, "plotly": 200, "api_list": 200, **hidden,
                "train": 403, "api_train": 403}

    def may(group, ok):
        return ok if role in group else 403
    return {"list": 200, "plotly": 200, "detail": 200, "api_list": 200, "api_detail": 200,
            "approve": may(APPROVERS, 302), "rollback": may(ROLLBACKERS, 302),
            "retire": may(TRAINERS, 302), "cancel": may(TRAINERS, 302),
            "train": may(TRAINERS, 302), "api_approve": may(APPROVERS, 200),
            "api_train": may(TRAINERS, 422)}   # 422: the tenant has no such workflow


def _walk(web, client, hdr, make_adapter, tenant) -> dict[str, int]:
    awaiting = make_adapter(tenant, "awaiting_approval")
    got = {"list": web.get("/adapters").status_code,
           "plotly": web.get("/adapters/plotly.js").status_code,
           "detail": web.get(f"/adapters/{awaiting.id}").status_code,
           "api_list": client.get("/api/v1/adapters", headers=hdr).status_code,
           "api_detail": client.get(f"/api/v1/adapters/{awaiting.id}",
                                    headers=hdr).status_code}
    for event, start in (("approve", "awaiting_approval"), ("rollback", "canary"),
                         ("retire", "candidate"), ("cancel", "training")):
        got[event] = _act(web, make_adapter(tenant, start), event).status_code
    got["train"] = submit(web, "/adapters", {"tenant_id": tenant.id, "workflow": "wf-none"},
                          action="/adapters/train").status_code
    got["api_approve"] = client.post(
        f"/api/v1/adapters/{make_adapter(tenant, 'awaiting_approval').id}/approve",
        headers=hdr, json={"comment": "ok"}).status_code
    got["api_train"] = client.post("/api/v1/adapters", headers=hdr,
                                   json={"tenant_id": tenant.id,
                                         "workflow": "wf-none"}).status_code
    return got


@pytest.mark.parametrize("scoped", [False, True], ids=["global", "tenant"])
@pytest.mark.parametrize("role", ROLES)
def test_route_role_walk(app, make_adapter, sign_in, api_as, two_tenants, role, scoped):
    own, other = two_tenants
    web, user = sign_in(role, tenant=own if scoped else None)
    client, hdr = api_as(user)
    for tenant, is_own in ((own, True), (other, False)):
        got = _walk(web, client, hdr, make_adapter, tenant)
        assert got == _expected(role, scoped, is_own), (role, scoped, is_own)
