"""Sign-in and sign-out."""
from __future__ import annotations

from flask import Blueprint, flash, redirect, render_template, request, url_for
from flask_login import current_user, login_required, login_user, logout_user

from app.auth import service
from app.auth.forms import LoginForm

bp = Blueprint("auth", __name__)


def _safe_next(target: str | None) -> str:
    """Only same-site paths: never ``//host`` or ``/\\host`` (open redirects)."""
    if not target or not target.startswith("/") or target[1:2] in ("/", "\\"):
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
    user = service.authenticate(form.email.data, form.password.data)
    if user is None:
        flash("Wrong email or password.", "error")
        return render_template("auth/login.html", form=form), 401
    login_user(user)
    return redirect(_safe_next(request.args.get("next")))


@bp.route("/logout", methods=["POST"])
@login_required
def logout():
    logout_user()
    flash("Signed out.", "info")
    return redirect(url_for("auth.login"))
