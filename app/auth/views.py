"""Sign-in and sign-out, users (admins only) and each user's own admin API tokens:
console pages (``bp``) and the admin API under ``/api/v1`` (``api_bp``)."""
from __future__ import annotations

from flask import (Blueprint, abort, flash, g, jsonify, redirect, render_template, request,
                   session, url_for)
from flask_login import current_user, login_required, login_user, logout_user

from app.api.views import api_auth, body
from app.auth import service, throttle
from app.auth.forms import LoginForm
from app.auth.models import ROLES, User
from app.console import reveal
from app.console.helpers import checkbox, form_data, render_errors, require
from app.errors import NotFound, ServiceError, TooManyAttempts
from app.extensions import db
from app.tenants.service import visible_tenants

bp = Blueprint("auth", __name__)
api_bp = Blueprint("auth_api", __name__)


def _safe_next(target: str | None) -> str:
    """Only same-site paths: never ``//host``, ``/\\host``, nor a path with control
    characters or spaces, which browsers strip (``/%09/evil.com`` is ``//evil.com``)."""
    if not target or not target.startswith("/") or target[1:2] in ("/", "\\") \
            or any(ord(c) < 0x21 or c == "\x7f" or c == "\\" for c in target):
        return url_for("console.home")
    return target


@bp.route("/login", methods=["GET", "POST"])
def login():
    if current_user.is_authenticated and request.method == "GET":
        return redirect(_safe_next(request.args.get("next")))
    form = LoginForm()
    if not form.is_submitted():
        return render_template("auth/login.html", form=form)
    if not form.validate():
        return render_template("auth/login.html", form=form), 400
    try:
        user = service.authenticate(form.email.data, form.password.data,
                                    request.remote_addr or "")
    except TooManyAttempts as exc:
        flash(exc.message, "error")
        return render_template("auth/login.html", form=form), 429
    if user is None:
        flash("Wrong email or password.", "error")
        return render_template("auth/login.html", form=form), 401
    session.clear()   # a new session: nothing set before sign-in carries over
    login_user(user)
    return redirect(_safe_next(request.args.get("next")))


@bp.route("/logout", methods=["POST"])
@login_required
def logout():
    user = db.session.get(User, current_user.id)
    service.end_sessions(user)   # this browser's session and every other one end
    db.session.commit()
    logout_user()
    session.clear()
    flash("Signed out.", "info")
    return redirect(url_for("auth.login"))


def _context(user: User | None) -> dict:
    return {"user": user, "roles": ROLES, "tenants": visible_tenants(current_user)}


@bp.route("/users")
@login_required
def users():
    require("user.manage")
    return render_template("console/users.html", users=service.list_users(current_user))


@bp.route("/users/new", methods=["GET", "POST"])
@login_required
def user_new():
    require("user.manage")
    values = {"email": "", "role": "viewer", "tenant_id": "", "active": True}
    if request.method == "POST":
        values = form_data("email", "role", "tenant_id", "password")
    return _user_form(None, values, lambda: service.create_user(current_user, values),
                      "created")


@bp.route("/users/<int:user_id>/edit", methods=["GET", "POST"])
@login_required
def user_edit(user_id: int):
    require("user.manage")
    user = db.session.get(User, user_id)
    if user is None:
        raise NotFound("no such user")
    values = {"email": user.email, "role": user.role, "tenant_id": user.tenant_id or "",
              "active": user.active}
    if request.method == "POST":
        values = form_data("email", "role", "tenant_id", "password") | {
            "active": checkbox("active")}
    return _user_form(user, values, lambda: service.update_user(current_user, user.id, values),
                      "saved")


def _user_form(user: User | None, values: dict, save, done: str):
    """The user form: shown on GET; on POST ``save()``, then back to the list, or the form
    again with the field errors (never the password typed)."""
    if request.method != "POST":
        return render_template("console/user_form.html", values=values, errors={},
                               **_context(user))
    try:
        saved = save()
    except ServiceError as exc:
        if not exc.errors:
            raise
        values.pop("password")
        return render_errors("console/user_form.html", exc, values=values, **_context(user))
    flash(f"User {saved.email} {done}.", "success")
    return redirect(url_for("auth.users"))


@bp.route("/tokens", methods=["GET", "POST"])
@login_required
def tokens():
    """POST creates a token and redirects; the GET after it shows the plaintext once."""
    if request.method == "POST":
        row, plaintext = service.create_admin_token(current_user, request.form.get("name", ""))
        reveal.stash("admin_token", row.id, plaintext)
        return redirect(url_for("auth.tokens", created=row.id))
    shown = reveal.take("admin_token")
    if shown is None and request.args.get("created"):
        flash("The new token was shown once and is no longer available. Revoke it and "
              "create another if it was not copied.", "info")
    return render_template("console/tokens.html", tokens=service.list_admin_tokens(current_user),
                           plaintext=shown[1] if shown else None)


@bp.route("/tokens/<int:token_id>/revoke", methods=["POST"])
@login_required
def token_revoke(token_id: int):
    row = service.revoke_admin_token(current_user, token_id)
    flash(f"Token {row.prefix}… revoked.", "success")
    return redirect(url_for("auth.tokens"))


# ------------------------------------------------------------------ admin API (/api/v1)

@api_bp.route("/auth/locks/lift", methods=["POST"])
@api_auth
def api_lift_lock():
    """``{"email": ...}`` or ``{"address": ...}``: lift that sign-in lock (admins)."""
    data = body()
    kind, ident = ("addr", str(data["address"])) if data.get("address") \
        else ("account", str(data.get("email") or "").strip().lower())
    had = throttle.lift(g.api_user, kind, ident)
    return jsonify(kind=kind, ident=ident, lifted=had)


@api_bp.route("/me")
@api_auth
def api_me():
    return jsonify(g.api_user.to_dict())


@api_bp.get("/users")
@api_auth
def api_users_list():
    return jsonify(users=[u.to_dict() for u in service.list_users(g.api_user)])


@api_bp.post("/users")
@api_auth
def api_user_create():
    return jsonify(service.create_user(g.api_user, body()).to_dict()), 201


def _user(user_id: int) -> User:
    if not g.api_user.can("user.manage"):
        abort(403)
    user = db.session.get(User, user_id)
    if user is None:
        raise NotFound("no such user")
    return user


@api_bp.get("/users/<int:user_id>")
@api_auth
def api_user_get(user_id: int):
    return jsonify(_user(user_id).to_dict())


@api_bp.patch("/users/<int:user_id>")
@api_auth
def api_user_update(user_id: int):
    data = body()
    _user(user_id)
    return jsonify(service.update_user(g.api_user, user_id, data).to_dict())


def _token(row) -> dict:
    return {"id": row.id, "name": row.name, "prefix": row.prefix,
            "created_at": row.created_at.isoformat(),
            "revoked_at": row.revoked_at.isoformat() if row.revoked_at else None}


@api_bp.get("/tokens")
@api_auth
def api_tokens_list():
    return jsonify(tokens=[_token(t) for t in service.list_admin_tokens(g.api_user)])


@api_bp.post("/tokens")
@api_auth
def api_token_create():
    data = body() if request.get_data() else {}
    row, plaintext = service.create_admin_token(g.api_user, str(data.get("name") or ""))
    return jsonify({**_token(row), "token": plaintext}), 201


@api_bp.delete("/tokens/<int:token_id>")
@api_auth
def api_token_revoke(token_id: int):
    return jsonify(_token(service.revoke_admin_token(g.api_user, token_id)))
