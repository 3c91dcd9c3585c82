"""Console pages (HTML). Thin: parse the form, call the service, render.

Every area's pages hang off the one ``console`` blueprint; they live in the sibling
modules imported at the bottom.
"""
from __future__ import annotations

from flask import Blueprint, render_template
from flask_login import current_user, login_required

from app.catalog import service as catalog
from app.tenants.service import visible_tenants

bp = Blueprint("console", __name__)


@bp.route("/")
@login_required
def home():
    return render_template("console/home.html", tiers=catalog.list_tiers(),
                           blended=catalog.blended_price,
                           tenants=visible_tenants(current_user))


from app.console import audit, catalog as _catalog, policies, tenants, users  # noqa: E402,F401
