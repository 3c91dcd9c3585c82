"""Sign-in and sign-out."""
from __future__ import annotations

from flask import Blueprint, flash, redirect, render_template, request, url_for
from flask_login import login_required, login_user, logout_user

from app.auth import service
from app.auth.forms import LoginForm

bp = Blueprint("auth", __name__)


@bp.route("/login", methods=["GET", "POST"])
def login():
    form = LoginForm()
    if form.validate_on_submit():
        user = service.authenticate(form.email.data, form.password.data)
        if user is not None:
            login_user(user)
            target = request.args.get("next") or ""
            if not target.startswith("/") or target.startswith("//"):
                target = url_for("console.home")
            return redirect(target)
        flash("Wrong email or password.", "error")
    return render_template("auth/login.html", form=form), 200 if request.method == "GET" or \
        form.errors == {} else 400


@bp.route("/logout", methods=["POST"])
@login_required
def logout():
    logout_user()
    flash("Signed out.", "info")
    return redirect(url_for("auth.login"))
