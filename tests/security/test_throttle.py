"""Security finding 10: sign-in and admin-token throttling per account and per client
address, with a clear message, an admin lift, and audit rows."""
from __future__ import annotations

import uuid

from app.audit.models import AuditLog
from app.extensions import db
from tests.console.web import browser, csrf_from
from tests.factories import PASSWORD, UserFactory


def _addr() -> str:
    return f"198.51.100.{uuid.uuid4().int % 250 + 1}-{uuid.uuid4().hex[:6]}"


def _sign_in(app, email: str, password: str, addr: str):
    client = browser(app)
    client.environ_base["REMOTE_ADDR"] = addr
    page = client.get("/login")
    return client.post("/login", data={"email": email, "password": password,
                                       "csrf_token": csrf_from(page.get_data(as_text=True))})


def test_five_wrong_passwords_lock_the_account_until_an_admin_lifts_it(app):
    user, addr = UserFactory(role="viewer"), _addr()
    for _ in range(5):
        assert _sign_in(app, user.email, "wrong-password", addr).status_code == 401
    locked = _sign_in(app, user.email, PASSWORD, _addr())   # even the right one, from elsewhere
    assert locked.status_code == 429
    assert "Too many failed attempts" in locked.get_data(as_text=True)
    assert db.session.scalar(db.select(AuditLog).where(
        AuditLog.action == "auth.lockout", AuditLog.entity_id == user.email)) is not None
    # an admin lifts it over the API
    from app.auth.service import create_admin_token
    admin = UserFactory(role="admin")
    _, token = create_admin_token(admin, "ops")
    client = app.test_client()
    r = client.post("/api/v1/auth/locks/lift", json={"email": user.email},
                    headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 200 and r.get_json()["lifted"] is True
    assert _sign_in(app, user.email, PASSWORD, addr).status_code == 302
    # a viewer may not lift locks
    _, vtoken = create_admin_token(user, "mine")
    r = client.post("/api/v1/auth/locks/lift", json={"email": user.email},
                    headers={"Authorization": f"Bearer {vtoken}"})
    assert r.status_code == 403


def test_unknown_emails_count_against_the_address(app):
    addr = _addr()
    for i in range(50):
        assert _sign_in(app, f"nobody{i}-{addr}@example.com", "x" * 12, addr).status_code == 401
    user = UserFactory(role="viewer")
    assert _sign_in(app, user.email, PASSWORD, addr).status_code == 429
    assert _sign_in(app, user.email, PASSWORD, _addr()).status_code == 302  # others unaffected


def test_guessing_admin_tokens_locks_the_address(app):
    client = app.test_client()
    addr = _addr()
    for i in range(50):
        r = client.get("/api/v1/me", headers={"Authorization": f"Bearer sl-admin-guess{i}"},
                       environ_base={"REMOTE_ADDR": addr})
        assert r.status_code == 401
    r = client.get("/api/v1/me", headers={"Authorization": "Bearer sl-admin-guess"},
                   environ_base={"REMOTE_ADDR": addr})
    assert r.status_code == 429 and r.get_json()["error"]["code"] == "too_many_attempts"
