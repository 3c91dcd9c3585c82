"""The global policy and each tenant's overrides: console pages (``bp``) and the admin API
under ``/api/v1`` (``api_bp``).

An empty input means "not set here": the global form then uses the built-in default,
a tenant's form inherits the global value.
"""
from __future__ import annotations

from typing import Any

from flask import Blueprint, abort, flash, g, jsonify, redirect, render_template, request, url_for
from flask_login import current_user, login_required

from app.api.views import api_auth, body
from app.console.helpers import render_errors
from app.contract import policy as schema
from app.errors import ServiceError
from app.policies import service
from app.tenants.service import get_tenant, visible_tenants

bp = Blueprint("policies", __name__)
api_bp = Blueprint("policies_api", __name__)


def _display(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ", ".join(value)
    return "" if value is None else str(value)


def _submitted() -> dict[str, str]:
    return {name: request.form.get(name, "").strip() for name in schema.FIELDS}


def _rows(own: dict[str, Any], inherited: dict[str, Any], submitted: dict[str, str] | None):
    """One row per field; for a tenant-scoped user, what they may do with it (``rule``,
    ``why``): central fields are shown read-only with the reason."""
    scoped = current_user.tenant_id is not None
    rows = []
    for name, f in schema.FIELDS.items():
        value = submitted.get(name, "") if submitted is not None else (
            _display(own[name]) if name in own else "")
        rule, why = schema.tenant_rule(name, inherited) if scoped else (schema.TENANT_FREE, "")
        if submitted is not None and rule == schema.TENANT_CENTRAL and name in own:
            value = _display(own[name])
        rows.append({"name": name, "field": f, "value": value,
                     "inherited": _display(inherited[name]), "rule": rule, "why": why,
                     "locked": rule == schema.TENANT_CENTRAL,
                     "kind": f.kind if isinstance(f.kind, str) else f.kind.__name__})
    return rows


def _save(tenant_id: int | None, template: str, context: dict):
    submitted = _submitted()
    given = {k: v for k, v in submitted.items() if v != ""}
    try:
        service.update_policy(current_user, tenant_id, given, replace=True)
    except ServiceError as exc:
        if not exc.errors:
            raise
        own = service.tenant_values(tenant_id) if tenant_id else {}
        context["rows"] = _rows(own, context["inherited"], submitted)
        return render_errors(template, exc, **context)
    flash("Policy saved.", "success")
    from app.adapters.serving import kept_forms
    kept = kept_forms(tenant_id)
    if kept:
        names = ", ".join(f"{a.name} ({', '.join(f)})" for a, f in kept[:5])
        more = f" and {len(kept) - 5} more" if len(kept) > 5 else ""
        flash(f"{len(kept)} adapter(s) learned another form of schema requests than this "
              f"policy gives: {names}{more}. They keep being served in the form they "
              f"learned (answers still reach clients with their own keys); retrain them to "
              f"learn this one.", "info")
    return None


@bp.route("/policies", methods=["GET", "POST"])
@login_required
def policy_global():
    can_manage = current_user.tenant_id is None and current_user.can("policy.manage")
    inherited = dict(schema.DEFAULTS)
    context = {"tenant": None, "can_manage": can_manage, "inherited": inherited,
               "tenants": visible_tenants(current_user), "errors": {}}
    if request.method == "POST":
        if not can_manage:
            abort(403)
        response = _save(None, "console/policy.html", context)
        if response is not None:
            return response
        return redirect(url_for("policies.policy_global"))
    context["rows"] = _rows(service.global_values(), inherited, None)
    return render_template("console/policy.html", **context)


@bp.route("/tenants/<int:tenant_id>/policy", methods=["GET", "POST"])
@login_required
def policy_tenant(tenant_id: int):
    tenant = get_tenant(current_user, tenant_id)
    can_manage = current_user.can("policy.manage", tenant.id)
    inherited = schema.effective(service.global_values(), None)
    context = {"tenant": tenant, "can_manage": can_manage, "inherited": inherited,
               "tenants": visible_tenants(current_user), "errors": {},
               "effective": service.effective_policy(tenant.id)}
    if request.method == "POST":
        if not can_manage:
            abort(403)
        response = _save(tenant.id, "console/policy.html", context)
        if response is not None:
            return response
        return redirect(url_for("policies.policy_tenant", tenant_id=tenant.id))
    context["rows"] = _rows(service.tenant_values(tenant.id), inherited, None)
    return render_template("console/policy.html", **context)


# ------------------------------------------------------------------ admin API (/api/v1)

def _policy(tenant_id: int | None) -> dict:
    own = service.tenant_values(tenant_id) if tenant_id else service.global_values()
    return {"tenant_id": tenant_id, "values": own,
            "effective": service.effective_policy(tenant_id)}


def _kept(tenant_id: int | None) -> list[dict]:
    """After an update: the held adapters that learned another form of schema requests
    than the policy now gives (``serving.kept_forms``); they keep being served in theirs."""
    from app.adapters.serving import kept_forms
    return [{"id": a.id, "name": a.name, "tenant_id": a.tenant_id, "state": a.state,
             "fields": fields} for a, fields in kept_forms(tenant_id)]


@api_bp.get("/policies/global")
@api_auth
def api_policy_global_get():
    return jsonify(_policy(None))


@api_bp.route("/policies/global", methods=["PATCH", "PUT"])
@api_auth
def api_policy_global_update():
    """PATCH merges the given fields; PUT replaces the whole set."""
    service.update_policy(g.api_user, None, body(), replace=request.method == "PUT")
    return jsonify({**_policy(None), "adapters_keeping_form": _kept(None)})


@api_bp.get("/tenants/<int:tenant_id>/policy")
@api_auth
def api_policy_tenant_get(tenant_id: int):
    get_tenant(g.api_user, tenant_id)
    return jsonify(_policy(tenant_id))


@api_bp.route("/tenants/<int:tenant_id>/policy", methods=["PATCH", "PUT"])
@api_auth
def api_policy_tenant_update(tenant_id: int):
    """PATCH merges (null or "" clears a field back to inherited); PUT replaces."""
    service.update_policy(g.api_user, tenant_id, body(), replace=request.method == "PUT")
    return jsonify({**_policy(tenant_id), "adapters_keeping_form": _kept(tenant_id)})
