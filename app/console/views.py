"""The console's home page and its template filters. Console pages are thin: parse the
form, call the service, render. Each area's pages are its own blueprint ``bp`` in
``app/<area>/views.py`` (next to its JSON ``api_bp``); shared helpers are
``app.console.helpers``, error pages ``app.console.errors``.
"""
from __future__ import annotations

from flask import (Blueprint, current_app, flash, redirect, render_template, request,
                   send_from_directory, url_for)
from flask_login import current_user, login_required

from app.catalog import service as catalog
from app.console import overview
from app.core.costing import format_usd
from app.tenants.service import visible_tenants

bp = Blueprint("console", __name__)


@bp.app_template_filter("usd")
def usd(value) -> str:
    """$ with at least 2 and at most 6 decimals, no trailing zeros past the cents (the
    one rule: ``costing.format_usd``)."""
    return format_usd(value)


@bp.route("/")
@login_required
def home():
    return render_template("console/home.html", o=overview.overview(current_user),
                           tiers=catalog.list_tiers(), blended=catalog.blended_price,
                           tenants=visible_tenants(current_user))


@bp.route("/overview/refresh", methods=["POST"])
@login_required
def refresh_figures():
    """Run the FinOps rollup now (what the beat runs every few minutes): the figures then
    include every request the ledger has."""
    from app.finops.service import run_rollups
    run_rollups()
    flash("Figures brought up to date with the ledger.", "success")
    target = request.form.get("next") or ""
    return redirect(target if target.startswith("/") and not target.startswith("//")
                    else url_for("console.home"))


@bp.route("/favicon.ico")
def favicon():
    """Browsers ask for /favicon.ico on pages that name no icon (an error page of a
    proxy, a JSON view): the console's own icon, not a 404 in every log."""
    return send_from_directory(current_app.static_folder, "favicon.svg",
                               mimetype="image/svg+xml", max_age=86400)
