"""Users (admin only) and each user's admin API tokens."""
import hashlib

from app.auth.models import AdminToken, User
from app.audit.models import AuditLog
from app.extensions import db
from app.security import verify_password
from tests.console.web import browser, login, submit
from tests.factories import TenantFactory, UserFactory


def test_admin_creates_a_scoped_user_who_can_sign_in(client, admin, app):
    tenant = TenantFactory(name="alpha")
    resp = submit(client, "/users/new", {"email": "Lead@Example.com", "role": "ops",
                                         "tenant_id": str(tenant.id),
                                         "password": "Department-Lead-7"})
    assert resp.status_code == 302
    user = db.session.scalar(db.select(User).where(User.email == "lead@example.com"))
    assert user.role == "ops" and user.tenant_id == tenant.id
    assert "Department-Lead-7" not in user.password_hash
    row = db.session.scalar(db.select(AuditLog).where(AuditLog.action == "user.create"))
    assert row.after["tenant_id"] == tenant.id and "password_hash" not in row.after
    other = browser(app)
    login(other, "lead@example.com", "Department-Lead-7")
    assert other.get("/users").status_code == 403


def test_weak_password_and_bad_email_are_refused(client, admin):
    resp = submit(client, "/users/new", {"email": "nope", "role": "wizard", "password": "short"})
    assert resp.status_code == 422
    html = resp.get_data(as_text=True)
    assert "must be an email address" in html and "at least 10 characters" in html
    assert "must be one of admin" in html
    resp = submit(client, "/users/new", {"email": admin.email, "role": "viewer",
                                         "password": "Long-enough-9"})
    assert resp.status_code == 409
    assert db.session.scalar(db.select(db.func.count(User.id))) == 1


def test_role_change_deactivate_and_password_reset(client, admin, app):
    user = UserFactory(role="viewer")
    resp = submit(client, f"/users/{user.id}/edit", {
        "email": user.email, "role": "finops", "tenant_id": "", "password": "Brand-New-Pass-1"})
    assert resp.status_code == 302
    db.session.expire_all()
    user = db.session.get(User, user.id)
    assert user.role == "finops" and user.active is False  # checkbox not sent = off
    assert verify_password(user.password_hash, "Brand-New-Pass-1")
    row = db.session.scalar(db.select(AuditLog).where(AuditLog.action == "user.update"))
    assert row.before["role"] == "viewer" and row.after == {**row.after, "role": "finops",
                                                           "active": False}
    resp = submit(client, f"/users/{admin.id}/edit", {"email": admin.email, "role": "viewer",
                                                      "active": "on"})
    assert resp.status_code == 422 and "cannot remove your own admin role" in \
        resp.get_data(as_text=True)


def test_admin_token_is_shown_once_hashed_and_revocable(client, as_role):
    viewer = as_role("viewer")
    resp = submit(client, "/tokens", {"name": "ci"})
    assert resp.status_code == 302
    html = client.get(resp.headers["Location"]).get_data(as_text=True)
    start = html.index('id="token-plaintext">') + len('id="token-plaintext">')
    plaintext = html[start:html.index("<", start)]
    reload_ = client.get(resp.headers["Location"]).get_data(as_text=True)
    assert plaintext not in reload_ and "was shown once" in reload_
    assert db.session.scalar(db.select(db.func.count(AdminToken.id))) == 1
    row = db.session.scalar(db.select(AdminToken))
    assert row.user_id == viewer.id
    assert row.token_hash == hashlib.sha256(plaintext.encode()).hexdigest()
    assert plaintext not in client.get("/tokens").get_data(as_text=True)
    assert plaintext not in repr(db.session.execute(db.text("SELECT * FROM admin_tokens")).all())
    api = browser(client.application)
    assert api.get("/api/v1/me", headers={"Authorization": f"Bearer {plaintext}"}
                   ).status_code == 200
    assert submit(client, "/tokens", {}, action=f"/tokens/{row.id}/revoke").status_code == 302
    assert api.get("/api/v1/me", headers={"Authorization": f"Bearer {plaintext}"}
                   ).status_code == 401
