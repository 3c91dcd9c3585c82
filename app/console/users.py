"""Console pages: users (admins only) and each user's own admin API tokens."""
from __future__ import annotations

from flask import flash, redirect, render_template, request, url_for
from flask_login import current_user, login_required

from app.auth import service
from app.auth.models import ROLES, User
from app.console.helpers import checkbox, form_data, render_errors, require
from app.console.views import bp
from app.errors import NotFound, ServiceError
from app.extensions import db
from app.tenants.service import visible_tenants


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
        try:
            user = service.create_user(current_user, values)
        except ServiceError as exc:
            if not exc.errors:
                raise
            values.pop("password")
            return render_errors("console/user_form.html", exc, values=values, **_context(None))
        flash(f"User {user.email} created.", "success")
        return redirect(url_for("console.users"))
    return render_template("console/user_form.html", values=values, errors={}, **_context(None))


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
        try:
            service.update_user(current_user, user.id, values)
        except ServiceError as exc:
            if not exc.errors:
                raise
            values.pop("password")
            return render_errors("console/user_form.html", exc, values=values, **_context(user))
        flash(f"User {user.email} saved.", "success")
        return redirect(url_for("console.users"))
    return render_template("console/user_form.html", values=values, errors={}, **_context(user))


@bp.route("/tokens", methods=["GET", "POST"])
@login_required
def tokens():
    plaintext = None
    status = 200
    if request.method == "POST":
        _row, plaintext = service.create_admin_token(current_user, request.form.get("name", ""))
        status = 201
    return render_template("console/tokens.html", tokens=service.list_admin_tokens(current_user),
                           plaintext=plaintext), status


@bp.route("/tokens/<int:token_id>/revoke", methods=["POST"])
@login_required
def token_revoke(token_id: int):
    row = service.revoke_admin_token(current_user, token_id)
    flash(f"Token {row.prefix}… revoked.", "success")
    return redirect(url_for("console.tokens"))
