"""Sign-in and sign-out through the real login form."""
from app.auth.models import User
from app.extensions import db
from tests.console.web import csrf_from, login, submit
from tests.factories import PASSWORD, UserFactory


def test_login_then_logout(client, app):
    user = UserFactory(role="viewer")
    login(client, user.email.upper())
    assert client.get("/tenants").status_code == 200
    db.session.expire_all()
    assert db.session.get(User, user.id).last_login_at is not None
    resp = submit(client, "/", {}, action="/logout")
    assert resp.status_code == 302
    assert client.get("/tenants").status_code == 302  # back to the login page


def test_wrong_password_and_inactive_user_are_refused(client, app):
    user = UserFactory(role="admin")
    resp = submit(client, "/login", {"email": user.email, "password": "Wrong-Password-1"})
    assert resp.status_code == 401 and "Wrong email or password" in resp.get_data(as_text=True)
    user.active = False
    db.session.commit()
    resp = submit(client, "/login", {"email": user.email, "password": PASSWORD})
    assert resp.status_code == 401
    assert client.get("/tenants").status_code == 302


def test_login_and_logout_need_the_csrf_token(client, app):
    user = UserFactory(role="admin")
    resp = client.post("/login", data={"email": user.email, "password": PASSWORD})
    assert resp.status_code == 400
    assert client.get("/tenants").status_code == 302
    login(client, user.email)
    assert client.post("/logout").status_code == 400
    assert client.get("/tenants").status_code == 200  # still signed in


def test_bad_email_is_a_field_error(client, app):
    resp = submit(client, "/login", {"email": "not-an-email", "password": "x"})
    assert resp.status_code == 400 and "must be an email address" in resp.get_data(as_text=True)


def test_next_only_redirects_within_the_site(client, app):
    user = UserFactory()
    page = client.get("/login")
    token = csrf_from(page.get_data(as_text=True))
    resp = client.post("/login?next=//evil.example/x", data={
        "email": user.email, "password": PASSWORD, "csrf_token": token})
    assert resp.status_code == 302 and "evil" not in resp.headers["Location"]
    submit(client, "/", {}, action="/logout")
    token = csrf_from(client.get("/login").get_data(as_text=True))
    resp = client.post("/login?next=/catalog/tiers", data={
        "email": user.email, "password": PASSWORD, "csrf_token": token})
    assert resp.headers["Location"].endswith("/catalog/tiers")
