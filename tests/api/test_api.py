"""The JSON admin API: auth, roles, tenant scope, validation, secrecy, audit."""
import hashlib
import logging

import pytest

from app.audit.models import AuditLog
from app.catalog.models import Tier
from app.extensions import db
from app.tenants.models import ApiKey, Tenant
from app.workflows.service import ensure_workflow
from tests.factories import PoolFactory, TenantFactory, TierFactory, UserFactory, make_key


def _count(model):
    return db.session.scalar(db.select(db.func.count(model.id)))


def test_missing_or_bad_token_is_401_json(client, app):
    for headers in ({}, {"Authorization": "Bearer sla-nope"}, {"Authorization": "Basic x"}):
        resp = client.get("/api/v1/tenants", headers=headers)
        assert resp.status_code == 401
        assert resp.json["error"]["code"] == "unauthorized"
        assert set(resp.json["error"]) == {"code", "message", "fields"}


def test_admin_crud_writes_audit_rows(api_as):
    api = api_as("admin")
    resp = api.post("/tenants", json={"name": "alpha", "department": "Sales"})
    assert resp.status_code == 201
    tid = resp.json["id"]
    assert api.patch(f"/tenants/{tid}", json={"status": "suspended"}).json["status"] == \
        "suspended"
    assert [t["name"] for t in api.get("/tenants").json["tenants"]] == ["alpha"]
    pool = api.post("/pools", json={"name": "gpu-a", "model": "m", "engine": "vllm",
                                    "options": {"quantization": "fp8"}, "desired_replicas": 2})
    assert pool.status_code == 201 and pool.json["options"] == {"quantization": "fp8"}
    assert len(api.get(f"/pools/{pool.json['id']}").json["replicas"]) == 2
    tier = api.post("/tiers", json={"name": "tier-1", "rank": 1, "model": "m",
                                    "price_input_per_m": "0.06", "price_output_per_m": "0.06",
                                    "upstream_kind": "pool", "pool_id": pool.json["id"]})
    assert tier.status_code == 201 and tier.json["price_blended_per_m"] == "0.06000000"
    assert api.patch(f"/tiers/{tier.json['id']}", json={"model": "m2"}).json["model"] == "m2"
    assert api.patch(f"/pools/{pool.json['id']}", json={"desired_replicas": 1}
                     ).json["desired_replicas"] == 1
    pol = api.patch("/policies/global", json={"margin_gamma": 0.9})
    assert pol.status_code == 200 and pol.json["effective"]["margin_gamma"] == 0.9
    tpol = api.patch(f"/tenants/{tid}/policy", json={"cache_salt": True})
    assert tpol.json["values"] == {"cache_salt": True}
    assert tpol.json["effective"]["margin_gamma"] == 0.9
    assert api.patch(f"/tenants/{tid}/policy", json={"cache_salt": None}).json["values"] == {}
    assert tpol.json["adapters_keeping_form"] == []
    # an adapter that learned minified keys, then the tenant turns minify off: the answer
    # names it (it keeps its form until retrained)
    from app.adapters.models import Adapter
    from app.contract.policy import form_of
    from app.extensions import db
    from app.policies.service import effective_policy
    held = Adapter(tenant_id=tid, workflow="wf", name=f"lora-api-{tid}", state="promoted",
                   form=form_of(effective_policy(tid)))
    db.session.add(held)
    db.session.commit()
    kept = api.patch(f"/tenants/{tid}/policy", json={"minify_enabled": False}).json
    assert kept["adapters_keeping_form"] == [{"id": held.id, "name": held.name,
                                              "tenant_id": tid, "state": "promoted",
                                              "fields": ["minify_enabled"]}]
    assert api.patch(f"/tenants/{tid}/policy", json={"minify_enabled": None}
                     ).json["adapters_keeping_form"] == []
    user = api.post("/users", json={"email": "v@example.com", "password": "Viewer-Pass-12"})
    assert user.status_code == 201 and user.json["role"] == "viewer"
    assert api.patch(f"/users/{user.json['id']}", json={"role": "finops"}).json["role"] == \
        "finops"
    actions = [e["action"] for e in api.get("/audit").json["entries"]]
    for action in ("tenant.create", "tenant.update", "pool.create", "pool.update", "tier.create",
                   "tier.update", "policy.update", "user.create", "user.update"):
        assert action in actions, action
    only = api.get("/audit?action=tier.update").json["entries"]
    assert [e["action"] for e in only] == ["tier.update"]
    assert only[0]["before"]["model"] == "m" and only[0]["after"]["model"] == "m2"
    assert api.get("/audit?limit=0").status_code == 400


def test_key_plaintext_only_in_the_create_response(api_as, caplog):
    caplog.set_level(logging.DEBUG)
    api = api_as("ops")
    tenant = TenantFactory(name="alpha")
    resp = api.post(f"/tenants/{tenant.id}/keys", json={"name": "bot",
                                                        "expires_at": "2999-01-01T00:00:00"})
    assert resp.status_code == 201
    plaintext = resp.json["key"]
    row = db.session.get(ApiKey, resp.json["id"])
    assert row.key_hash == hashlib.sha256(plaintext.encode()).hexdigest()
    assert plaintext.startswith(resp.json["prefix"])
    listing = api.get(f"/tenants/{tenant.id}/keys")
    assert plaintext not in listing.get_data(as_text=True)
    assert "key_hash" not in listing.get_data(as_text=True)
    assert plaintext not in api.get(f"/keys/{row.id}").get_data(as_text=True)
    assert plaintext not in repr(db.session.execute(db.text("SELECT * FROM api_keys")).all())
    assert plaintext not in repr(db.session.execute(db.text("SELECT * FROM audit_log")).all())
    assert plaintext not in caplog.text
    revoked = api.delete(f"/keys/{row.id}")
    assert revoked.status_code == 200 and revoked.json["revoked_at"]
    assert api.delete(f"/keys/{row.id}").status_code == 409
    audit = db.session.scalar(db.select(AuditLog).where(AuditLog.action == "key.revoke"))
    assert audit.before["revoked_at"] is None and audit.after["revoked_at"]


@pytest.mark.parametrize("role", ["viewer", "finops", "approver"])
def test_read_only_roles_get_403_and_nothing_changes(api_as, role):
    tenant = TenantFactory(name="alpha")
    key, _ = make_key(tenant)
    pool = PoolFactory(name="p1")
    tier = TierFactory(name="tier-1", rank=1)
    wf = ensure_workflow(tenant.id, "sig")
    other = UserFactory()
    api = api_as(role)
    assert api.get("/tenants").status_code == 200
    assert api.get(f"/tenants/{tenant.id}/keys").status_code == 200
    assert api.get("/tiers").status_code == 200 and api.get("/workflows").status_code == 200
    calls = [("post", "/tenants", {"name": "x"}), ("patch", f"/tenants/{tenant.id}", {"name": "y"}),
             ("post", f"/tenants/{tenant.id}/keys", {"name": "k"}),
             ("delete", f"/keys/{key.id}", None),
             ("post", "/tiers", {"name": "tier-9", "rank": 9, "model": "m"}),
             ("patch", f"/tiers/{tier.id}", {"model": "z"}),
             ("post", "/pools", {"name": "p9", "model": "m"}),
             ("patch", f"/pools/{pool.id}", {"model": "z"}),
             ("patch", "/policies/global", {"margin_gamma": 0.5}),
             ("put", f"/tenants/{tenant.id}/policy", {"margin_gamma": 0.5}),
             ("post", "/users", {"email": "n@example.com", "password": "Long-enough-9"}),
             ("patch", f"/users/{other.id}", {"role": "admin"}),
             ("get", "/users", None), ("get", "/audit", None),
             ("patch", f"/workflows/{wf.id}", {"name": "n"})]
    audit_before = _count(AuditLog)
    for method, path, payload in calls:
        resp = getattr(api, method)(path, json=payload)
        assert resp.status_code == 403, (method, path, resp.json)
        assert resp.json["error"]["code"] in ("forbidden", "403")
    db.session.expire_all()
    assert _count(AuditLog) == audit_before
    assert [t.name for t in db.session.scalars(db.select(Tenant))] == ["alpha"]
    assert db.session.get(ApiKey, key.id).revoked_at is None and _count(ApiKey) == 1
    assert db.session.get(Tier, tier.id).model == "tiny" and _count(Tier) == 1


def test_scoped_user_cannot_see_or_change_another_tenants_keys(api_as):
    alpha, bravo = TenantFactory(name="alpha"), TenantFactory(name="bravo")
    bravo_key, _ = make_key(bravo)
    api = api_as("ops", tenant=alpha)
    audit_before = _count(AuditLog)  # the token's own creation
    assert [t["name"] for t in api.get("/tenants").json["tenants"]] == ["alpha"]
    for method, path, payload in (("get", f"/tenants/{bravo.id}", None),
                                  ("get", f"/tenants/{bravo.id}/keys", None),
                                  ("post", f"/tenants/{bravo.id}/keys", {"name": "x"}),
                                  ("get", f"/keys/{bravo_key.id}", None),
                                  ("delete", f"/keys/{bravo_key.id}", None),
                                  ("patch", f"/tenants/{bravo.id}", {"name": "z"}),
                                  ("get", f"/tenants/{bravo.id}/policy", None),
                                  ("patch", f"/tenants/{bravo.id}/policy", {"cache_salt": True})):
        resp = getattr(api, method)(path, json=payload)
        assert resp.status_code == 404, (method, path)
        assert resp.json["error"]["code"] == "not_found"
    assert api.post("/tenants", json={"name": "new"}).status_code == 403
    assert api.patch("/policies/global", json={"margin_gamma": 1}).status_code == 403
    db.session.expire_all()
    assert db.session.get(ApiKey, bravo_key.id).revoked_at is None
    assert _count(ApiKey) == 1 and _count(AuditLog) == audit_before
    mine = api.post(f"/tenants/{alpha.id}/keys", json={"name": "mine"})
    assert mine.status_code == 201


def test_invalid_input_gets_field_errors_and_changes_nothing(api_as):
    api = api_as("admin")
    TenantFactory(name="taken")
    audit_before = _count(AuditLog)
    resp = api.post("/tenants", json={"name": "", "status": "weird"})
    assert resp.status_code == 422
    assert resp.json["error"]["code"] == "validation_error"
    assert set(resp.json["error"]["fields"]) == {"name", "status"}
    resp = api.post("/tenants", json={"name": "taken"})
    assert resp.status_code == 409
    assert resp.json["error"]["fields"] == {"name": ["is already taken"]}
    resp = api.client.post("/api/v1/tenants", data="not json", headers={
        **api.headers, "Content-Type": "application/json"})
    assert resp.status_code == 400
    assert resp.json["error"]["fields"] == {"body": ["not a JSON object"]}
    resp = api.post("/tiers", json={"name": "Bad Name", "rank": 0, "model": "",
                                    "price_input_per_m": "-1", "upstream_kind": "moon"})
    assert resp.status_code == 422
    assert {"name", "rank", "model", "price_input_per_m", "upstream_kind"} <= set(
        resp.json["error"]["fields"])
    resp = api.patch("/policies/global", json={"router_tau_1": 0.1, "router_tau_2": 0.9})
    assert resp.status_code == 422 and "router_tau_1" in resp.json["error"]["fields"]
    resp = api.patch("/policies/global", json={"nonsense": 1})
    assert resp.json["error"]["fields"] == {"nonsense": ["unknown policy field"]}
    resp = api.post("/users", json={"email": "x@example.com", "password": "aaaaaaaaaa"})
    assert resp.status_code == 422 and "password" in resp.json["error"]["fields"]
    assert api.get("/tenants/99999").status_code == 404
    assert api.patch("/tiers/99999", json={}).status_code == 404
    assert api.get("/users/99999").status_code == 404
    assert api.put("/tenants").status_code == 405
    assert _count(Tenant) == 1 and _count(Tier) == 0 and _count(AuditLog) == audit_before


def test_workflows_and_own_tokens(api_as):
    api = api_as("ops")
    tenant = TenantFactory(name="alpha")
    wf = ensure_workflow(tenant.id, "s" * 64)
    resp = api.patch(f"/workflows/{wf.id}", json={"name": "triage", "category": "support_rag"})
    assert resp.status_code == 200 and resp.json["category"] == "support_rag"
    assert api.patch(f"/workflows/{wf.id}", json={"signature": "x"}).status_code == 422
    assert [w["name"] for w in api.get("/workflows").json["workflows"]] == ["triage"]
    created = api.post("/tokens", json={"name": "second"})
    assert created.status_code == 201 and created.json["token"].startswith("sla-")
    listed = api.get("/tokens").get_data(as_text=True)
    assert created.json["token"] not in listed and created.json["prefix"] in listed
    assert api.delete(f"/tokens/{created.json['id']}").json["revoked_at"]
    second = api.client.get("/api/v1/me", headers={
        "Authorization": f"Bearer {created.json['token']}"})
    assert second.status_code == 401
