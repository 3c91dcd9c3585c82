"""Console pages: the audit log and workflows."""
from __future__ import annotations

from flask import flash, redirect, render_template, request, url_for
from flask_login import current_user, login_required

from app.audit.models import AuditLog
from app.audit.service import list_entries
from app.console.helpers import form_data, render_errors, require
from app.console.views import bp
from app.errors import ServiceError
from app.extensions import db
from app.workflows import service as workflows
from app.workflows.models import COHORTS


@bp.route("/audit")
@login_required
def audit():
    require("audit.read")
    action = request.args.get("action", "").strip() or None
    actions = list(db.session.scalars(db.select(AuditLog.action).distinct()
                                      .order_by(AuditLog.action)))
    return render_template("console/audit.html", entries=list_entries(current_user, action=action),
                           action=action or "", actions=actions)


@bp.route("/workflows")
@login_required
def workflows_list():
    rows = workflows.list_workflows(current_user)
    return render_template("console/workflows.html", workflows=rows,
                           editable={w.id for w in rows
                                     if current_user.can("workflow.manage", w.tenant_id)})


@bp.route("/workflows/<int:workflow_id>/edit", methods=["GET", "POST"])
@login_required
def workflow_edit(workflow_id: int):
    workflow = workflows.get_workflow(current_user, workflow_id)
    require("workflow.manage", workflow.tenant_id)
    values = {"name": workflow.name, "category": workflow.category}
    if request.method == "POST":
        values = form_data("name", "category")
        try:
            workflows.update_workflow(current_user, workflow.id, values)
        except ServiceError as exc:
            if not exc.errors:
                raise
            return render_errors("console/workflow_form.html", exc, values=values,
                                 workflow=workflow, cohorts=COHORTS)
        flash("Workflow saved.", "success")
        return redirect(url_for("console.workflows_list"))
    return render_template("console/workflow_form.html", values=values, errors={},
                           workflow=workflow, cohorts=COHORTS)
