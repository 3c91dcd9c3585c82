"""Tenants and keys in the console: audit, validation, CSRF, secrets, tenant scope."""
import hashlib
import json
import logging

from app.audit.models import AuditLog
from app.extensions import db
from app.tenants.models import ApiKey, Tenant
from tests.console.web import browser, csrf_from, login, submit
from tests.factories import TenantFactory, make_key


def _audit(action):
    return list(db.session.scalars(db.select(AuditLog).where(AuditLog.action == action)))


def test_admin_creates_and_edits_a_tenant_with_audit_rows(client, admin):
    resp = submit(client, "/tenants/new", {"name": "support", "department": "CX",
                                           "status": "active"})
    assert resp.status_code == 302
    tenant = db.session.scalar(db.select(Tenant).where(Tenant.name == "support"))
    assert tenant.department == "CX"
    [row] = _audit("tenant.create")
    assert row.actor_email == admin.email and row.after["name"] == "support"

    resp = submit(client, f"/tenants/{tenant.id}/edit", {"name": "support", "department": "CX-2",
                                                         "status": "suspended"})
    assert resp.status_code == 302
    db.session.expire_all()
    assert db.session.get(Tenant, tenant.id).status == "suspended"
    [row] = _audit("tenant.update")
    assert row.before["department"] == "CX" and row.after["department"] == "CX-2"
    assert row.after["status"] == "suspended"
    assert "support" in client.get("/tenants").get_data(as_text=True)


def test_invalid_tenant_is_re_rendered_with_field_errors_and_nothing_changes(client, admin):
    TenantFactory(name="taken")
    resp = submit(client, "/tenants/new", {"name": "", "department": "x" * 101,
                                           "status": "gone"})
    assert resp.status_code == 422
    html = resp.get_data(as_text=True)
    assert 'data-field="name"' in html and "is required" in html
    assert "at most 100 characters" in html and "must be one of active, suspended" in html
    assert 'value="' + "x" * 101 + '"' in html  # the user's input is kept
    resp = submit(client, "/tenants/new", {"name": "taken", "status": "active"})
    assert resp.status_code == 409 and "is already taken" in resp.get_data(as_text=True)
    assert db.session.scalar(db.select(db.func.count(Tenant.id))) == 1
    assert _audit("tenant.create") == []


def test_forms_without_csrf_token_are_rejected_and_change_nothing(client, admin):
    tenant = TenantFactory(name="alpha")
    key, _ = make_key(tenant)
    for url, data in (("/tenants/new", {"name": "sneaky", "status": "active"}),
                      (f"/tenants/{tenant.id}/edit", {"name": "renamed", "status": "active"}),
                      (f"/tenants/{tenant.id}/keys", {"name": "sneaky-key"}),
                      (f"/keys/{key.id}/revoke", {}),
                      ("/catalog/tiers/new", {"name": "tier-9", "rank": 9, "model": "m"}),
                      ("/policies", {"margin_gamma": "0.5"}),
                      ("/users/new", {"email": "x@example.com", "password": "Long-enough-9"}),
                      ("/tokens", {"name": "sneaky"})):
        resp = client.post(url, data=data)
        assert resp.status_code == 400, url
        assert "CSRF" in resp.get_data(as_text=True)
        resp = client.post(url, data={**data, "csrf_token": "forged"})
        assert resp.status_code == 400, url
    db.session.expire_all()
    assert [t.name for t in db.session.scalars(db.select(Tenant))] == ["alpha"]
    assert db.session.get(ApiKey, key.id).revoked_at is None
    assert db.session.scalar(db.select(db.func.count(ApiKey.id))) == 1
    assert db.session.scalar(db.select(db.func.count(AuditLog.id))) == 0


def test_key_plaintext_is_shown_once_and_never_stored_or_logged(client, admin, caplog):
    caplog.set_level(logging.DEBUG)
    tenant = TenantFactory(name="alpha")
    resp = submit(client, f"/tenants/{tenant.id}/keys", {"name": "bot", "expires_at": ""})
    # POST/redirect/GET: the POST's answer carries no secret, the page after it does
    assert resp.status_code == 302 and "sk-" not in resp.get_data(as_text=True)
    shown = client.get(resp.headers["Location"])
    html = shown.get_data(as_text=True)
    key = db.session.scalar(db.select(ApiKey).where(ApiKey.tenant_id == tenant.id))
    start = html.index('id="key-plaintext">') + len('id="key-plaintext">')
    plaintext = html[start:html.index("<", start)]
    assert plaintext.startswith(key.prefix) and len(plaintext) > len(key.prefix) + 20
    assert key.key_hash == hashlib.sha256(plaintext.encode()).hexdigest()
    # with what to do with it: the gateway URL and ready snippets
    assert "http://127.0.0.1:8400/v1" in html and f'api_key="{plaintext}"' in html
    assert f"Authorization: Bearer {plaintext}" in html

    # a reload shows it no more, creates nothing, and says why
    again = client.get(resp.headers["Location"]).get_data(as_text=True)
    assert plaintext not in again and key.prefix in again  # prefix visible, secret gone
    assert "was shown once" in again
    assert db.session.scalar(db.select(db.func.count(ApiKey.id))) == 1
    rows = db.session.execute(db.text("SELECT * FROM api_keys")).all()
    assert plaintext not in repr(rows)
    audit = db.session.execute(db.text("SELECT * FROM audit_log")).all()
    assert audit and plaintext not in repr(audit) and key.key_hash not in repr(audit)
    assert plaintext not in caplog.text
    assert plaintext not in json.dumps(client.get("/audit").get_data(as_text=True))
    # and nothing of it waits in Redis once shown
    from app.redis_client import get_redis, keys
    r = get_redis()
    assert not [k for k in r.scan_iter(keys().secret_reveal("*")) if plaintext.encode() in
                (r.get(k) or b"")]


def test_a_new_key_is_revealed_only_to_the_session_that_created_it(client, admin):
    tenant = TenantFactory(name="alpha")
    resp = submit(client, f"/tenants/{tenant.id}/keys", {"name": "bot", "expires_at": ""})
    other = browser(client.application)
    login(other, admin.email)            # the same user, another browser
    assert 'id="key-plaintext"' not in other.get(resp.headers["Location"]).get_data(as_text=True)
    assert 'id="key-plaintext"' in client.get(resp.headers["Location"]).get_data(as_text=True)


def test_key_with_expiry_then_revoked_writes_audit(client, admin):
    tenant = TenantFactory(name="alpha")
    resp = submit(client, f"/tenants/{tenant.id}/keys", {"name": "temp",
                                                         "expires_at": "2999-01-01T00:00"})
    assert resp.status_code == 302
    key = db.session.scalar(db.select(ApiKey))
    assert key.expires_at.year == 2999
    resp = submit(client, f"/tenants/{tenant.id}/keys", {}, action=f"/keys/{key.id}/revoke")
    assert resp.status_code == 302
    db.session.expire_all()
    assert db.session.get(ApiKey, key.id).revoked_at is not None
    [row] = _audit("key.revoke")
    assert row.before["revoked_at"] is None and row.after["revoked_at"] is not None


def test_invalid_key_input_gets_field_errors_and_no_key(client, admin):
    tenant = TenantFactory(name="alpha")
    resp = submit(client, f"/tenants/{tenant.id}/keys", {"name": "", "expires_at": "2001-01-01"})
    assert resp.status_code == 422
    html = resp.get_data(as_text=True)
    assert "is required" in html and "must be in the future" in html
    assert "data-secret" not in html
    resp = submit(client, f"/tenants/{tenant.id}/keys", {"name": "x", "expires_at": "soon"})
    assert resp.status_code == 422 and "must be an ISO date" in resp.get_data(as_text=True)
    assert db.session.scalar(db.select(db.func.count(ApiKey.id))) == 0
    assert _audit("key.create") == []


def test_tenant_scoped_user_sees_and_manages_only_their_tenant(client, as_role, two_tenants):
    alpha, bravo = two_tenants
    bravo_key, _ = make_key(bravo, "bravo-key")
    lead = as_role("ops", tenant=alpha)
    listing = client.get("/tenants").get_data(as_text=True)
    assert "alpha" in listing and "bravo" not in listing
    assert client.get(f"/tenants/{bravo.id}/keys").status_code == 404
    assert client.get(f"/tenants/{bravo.id}/edit").status_code == 404
    assert client.get(f"/tenants/{bravo.id}/policy").status_code == 404
    token = csrf_from(client.get(f"/tenants/{alpha.id}/keys").get_data(as_text=True))
    assert client.post(f"/keys/{bravo_key.id}/revoke",
                       data={"csrf_token": token}).status_code == 404
    assert client.post(f"/tenants/{bravo.id}/keys",
                       data={"name": "x", "csrf_token": token}).status_code == 404
    assert client.get("/tenants/new").status_code == 403
    db.session.expire_all()
    assert db.session.get(ApiKey, bravo_key.id).revoked_at is None
    assert db.session.scalar(db.select(db.func.count(ApiKey.id)).where(
        ApiKey.tenant_id == bravo.id)) == 1
    # ...but manages its own tenant's keys.
    resp = submit(client, f"/tenants/{alpha.id}/keys", {"name": "mine"})
    assert resp.status_code == 302
    [row] = _audit("key.create")
    assert row.actor_email == lead.email and row.tenant_id == alpha.id
