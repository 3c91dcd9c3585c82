"""Security finding 12 (sessions): a sign-out or a password change ends every session of
the user, elsewhere too, and sign-in starts a fresh session."""
from __future__ import annotations

from app.auth import service
from tests.console.web import browser, login
from tests.factories import UserFactory


def _signed_in(app, email):
    client = browser(app)
    login(client, email)
    assert client.get("/").status_code == 200
    return client


def test_signing_out_ends_the_sessions_on_other_browsers_too(app):
    user = UserFactory(role="viewer")
    laptop, phone = _signed_in(app, user.email), _signed_in(app, user.email)
    from tests.console.web import csrf_from
    token = csrf_from(laptop.get("/").get_data(as_text=True))
    assert laptop.post("/logout", data={"csrf_token": token}).status_code == 302
    assert laptop.get("/").status_code == 302      # back to the sign-in page
    assert phone.get("/").status_code == 302       # the other session ended too
    assert _signed_in(app, user.email).get("/").status_code == 200


def test_a_password_change_ends_every_session(app):
    user = UserFactory(role="viewer")
    browser_a = _signed_in(app, user.email)
    service.update_user(UserFactory(role="admin"), user.id, {"password": "Another-Pass-77"})
    assert browser_a.get("/").status_code == 302
    login(browser(app), user.email, "Another-Pass-77")


def test_a_forged_or_stale_session_id_loads_no_one(app):
    user = UserFactory(role="admin")
    assert service.user_for_session(f"{user.id}.{user.session_epoch}") == user
    assert service.user_for_session(f"{user.id}") is None           # the old cookie format
    assert service.user_for_session(f"{user.id}.{user.session_epoch + 1}") is None
    assert service.user_for_session("x.y") is None
