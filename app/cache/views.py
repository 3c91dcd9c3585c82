"""Console page and admin API for cache invalidation (by tenant, workflow, or everything).

Both call ``app.cache.service.invalidate_cache``, which checks the permission (ops and
admin roles; a tenant user only for their own tenant) and writes the audit row.
"""
from __future__ import annotations

from flask import Blueprint, abort, flash, g, jsonify, redirect, render_template, request, url_for
from flask_login import current_user, login_required

from app.api.views import api_auth, body
from app.cache.service import cache_quality, invalidate_cache
from app.errors import ValidationError
from app.tenants.service import visible_tenants
from app.workflows.service import list_workflows

bp = Blueprint("cache", __name__, url_prefix="/cache")
api_bp = Blueprint("cache_api", __name__)

SCOPES = ("tenant", "workflow", "all")


def _int(value, field: str) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ValidationError(f"{field} must be a whole number", {field: ["not a whole number"]}) from None


def _invalidate(user, data: dict) -> tuple[int, dict]:
    """Parse ``{"scope", "tenant_id", "workflow_id", "workflow"}`` (form or JSON) and call
    the service; returns (removed, what was asked)."""
    scope = str(data.get("scope") or "").strip()
    if scope not in SCOPES:
        raise ValidationError("scope must be tenant, workflow or all",
                              {"scope": [f"one of {', '.join(SCOPES)}"]})
    if scope == "all":
        return invalidate_cache(user, everything=True), {"scope": "all"}
    if scope == "tenant":
        if data.get("tenant_id") in (None, ""):
            raise ValidationError("tenant_id is required", {"tenant_id": ["required"]})
        tenant_id = _int(data["tenant_id"], "tenant_id")
        return invalidate_cache(user, tenant_id=tenant_id), {"scope": "tenant", "tenant_id": tenant_id}
    if data.get("workflow_id") not in (None, ""):
        workflow_id = _int(data["workflow_id"], "workflow_id")
        return (invalidate_cache(user, workflow_id=workflow_id),
                {"scope": "workflow", "workflow_id": workflow_id})
    signature = str(data.get("workflow") or "").strip()
    if not signature:
        raise ValidationError("workflow_id or workflow (signature) is required",
                              {"workflow_id": ["required"]})
    tenant_id = None if data.get("tenant_id") in (None, "") else _int(data["tenant_id"], "tenant_id")
    return (invalidate_cache(user, tenant_id=tenant_id, workflow=signature),
            {"scope": "workflow", "workflow": signature, "tenant_id": tenant_id})


def _may_invalidate(user) -> bool:
    return user.can("cache.invalidate", user.tenant_id)


@bp.route("/")
@login_required
def index():
    if not _may_invalidate(current_user):
        abort(403)
    return render_template("cache/index.html", tenants=visible_tenants(current_user),
                           workflows=list_workflows(current_user),
                           can_all=current_user.tenant_id is None,
                           quality=cache_quality(current_user))


@bp.route("/invalidate", methods=["POST"])
@login_required
def invalidate():
    if not _may_invalidate(current_user):
        abort(403)
    try:
        removed, asked = _invalidate(current_user, dict(request.form))
    except ValidationError as exc:  # Forbidden / NotFound go to the error page with their status
        flash(exc.message, "error")
        return redirect(url_for("cache.index")), 303
    what = {"all": "everything", "tenant": "the tenant", "workflow": "the workflow"}[asked["scope"]]
    flash(f"Cache invalidated for {what}: {removed} entries removed.", "success")
    return redirect(url_for("cache.index")), 303


@api_bp.post("/cache/invalidate")
@api_auth
def api_invalidate():
    """``{"scope": "tenant", "tenant_id": N}``, ``{"scope": "workflow", "workflow_id": N}``
    (or ``"workflow": signature`` with an optional ``tenant_id``), or ``{"scope": "all"}``."""
    removed, asked = _invalidate(g.api_user, body())
    return jsonify({**asked, "removed": removed})
