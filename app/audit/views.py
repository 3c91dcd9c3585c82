"""The audit log: console page (``bp``) and the admin API under ``/api/v1`` (``api_bp``)."""
from __future__ import annotations

from flask import Blueprint, abort, g, jsonify, render_template, request
from flask_login import current_user, login_required

from app.api.views import api_auth, int_arg
from app.audit.models import AuditLog
from app.audit.service import list_entries
from app.console.helpers import require
from app.extensions import db

bp = Blueprint("audit", __name__)
api_bp = Blueprint("audit_api", __name__)


@bp.route("/audit")
@login_required
def audit():
    require("audit.read")
    action = request.args.get("action", "").strip() or None
    actions = list(db.session.scalars(db.select(AuditLog.action).distinct()
                                      .order_by(AuditLog.action)))
    return render_template("console/audit.html", entries=list_entries(current_user, action=action),
                           action=action or "", actions=actions)


# ------------------------------------------------------------------ admin API (/api/v1)

@api_bp.get("/audit")
@api_auth
def api_audit_list():
    if not g.api_user.can("audit.read"):
        abort(403)
    entries = list_entries(g.api_user, limit=int_arg("limit", 200, 1, 1000),
                           action=request.args.get("action") or None)
    return jsonify(entries=[e.to_dict() for e in entries])
