"""Console pages (HTML). Thin: parse the form, call the service, render."""
from __future__ import annotations

from flask import Blueprint, render_template
from flask_login import login_required

from app.catalog import service as catalog

bp = Blueprint("console", __name__)


@bp.route("/")
@login_required
def home():
    return render_template("console/home.html", tiers=catalog.list_tiers())
