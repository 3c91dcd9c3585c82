"""Workflows (created by traffic, named and categorised by people): console pages (``bp``)
and the admin API under ``/api/v1`` (``api_bp``)."""
from __future__ import annotations

from flask import Blueprint, flash, g, jsonify, redirect, render_template, request, url_for
from flask_login import current_user, login_required

from app.api.views import api_auth, body
from app.console.helpers import form_data, render_errors, require
from app.errors import ServiceError
from app.workflows import service
from app.workflows.models import COHORTS

bp = Blueprint("workflows", __name__)
api_bp = Blueprint("workflows_api", __name__)


@bp.route("/workflows")
@login_required
def workflows_list():
    """Workflows, with where auto traffic goes now: a workflow younger than its tenant's
    ``frontier_first_hours`` is in its warm-up window (every auto request on the frontier
    tier, so its traces can teach the router and the adapters), until the time shown."""
    from datetime import datetime, timedelta, timezone

    from app.policies.service import effective_policy
    rows = service.list_workflows(current_user)
    now = datetime.now(timezone.utc)
    hours: dict[int, float] = {}
    warmup = {}
    for w in rows:
        if w.tenant_id not in hours:
            hours[w.tenant_id] = float(effective_policy(w.tenant_id)["frontier_first_hours"])
        first = w.first_seen_at if w.first_seen_at.tzinfo else \
            w.first_seen_at.replace(tzinfo=timezone.utc)
        until = first + timedelta(hours=hours[w.tenant_id])
        if until > now:
            warmup[w.id] = until
    return render_template("console/workflows.html", workflows=rows, warmup=warmup,
                           tool_tokens=service.tool_token_totals(rows),
                           tool_memory=service.tool_memory_sizes(rows),
                           tool_days=service.TOOL_TOKEN_DAYS,
                           editable={w.id for w in rows
                                     if current_user.can("workflow.manage", w.tenant_id)})


@bp.route("/workflows/<int:workflow_id>/edit", methods=["GET", "POST"])
@login_required
def workflow_edit(workflow_id: int):
    workflow = service.get_workflow(current_user, workflow_id)
    require("workflow.manage", workflow.tenant_id)
    values = {"name": workflow.name, "category": workflow.category}
    if request.method == "POST":
        values = form_data("name", "category")
        try:
            service.update_workflow(current_user, workflow.id, values)
        except ServiceError as exc:
            if not exc.errors:
                raise
            return render_errors("console/workflow_form.html", exc, values=values,
                                 workflow=workflow, cohorts=COHORTS)
        flash("Workflow saved.", "success")
        return redirect(url_for("workflows.workflows_list"))
    return render_template("console/workflow_form.html", values=values, errors={},
                           workflow=workflow, cohorts=COHORTS)


# ------------------------------------------------------------------ admin API (/api/v1)

@api_bp.get("/workflows")
@api_auth
def api_workflows_list():
    return jsonify(workflows=[w.to_dict() for w in service.list_workflows(g.api_user)])


@api_bp.get("/workflows/<int:workflow_id>")
@api_auth
def api_workflow_get(workflow_id: int):
    return jsonify(service.get_workflow(g.api_user, workflow_id).to_dict())


@api_bp.patch("/workflows/<int:workflow_id>")
@api_auth
def api_workflow_update(workflow_id: int):
    return jsonify(service.update_workflow(g.api_user, workflow_id, body()).to_dict())
