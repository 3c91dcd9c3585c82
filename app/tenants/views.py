"""Tenants and their gateway API keys: console pages (``bp``) and the admin API under
``/api/v1`` (``api_bp``)."""
from __future__ import annotations

from flask import (Blueprint, abort, current_app, flash, g, jsonify, redirect, render_template,
                   request, url_for)
from flask_login import current_user, login_required

from app.api.views import api_auth, body
from app.console import reveal
from app.console.helpers import form_data, render_errors, require
from app.errors import ServiceError
from app.tenants import service
from app.tenants.models import TENANT_STATUSES

bp = Blueprint("tenants", __name__)
api_bp = Blueprint("tenants_api", __name__)

TENANT_FIELDS = ("name", "department", "status")


@bp.route("/tenants")
@login_required
def tenants():
    return render_template("console/tenants.html", tenants=service.visible_tenants(current_user))


@bp.route("/tenants/new", methods=["GET", "POST"])
@login_required
def tenant_new():
    if current_user.tenant_id is not None:
        abort(403)
    require("tenant.manage")
    values = {"name": "", "department": "", "status": "active"}
    if request.method == "POST":
        values = form_data(*TENANT_FIELDS)
        try:
            tenant = service.create_tenant(current_user, values)
        except ServiceError as exc:
            if not exc.errors:
                raise
            return render_errors("console/tenant_form.html", exc, values=values, tenant=None,
                                 statuses=TENANT_STATUSES)
        flash(f"Tenant {tenant.name} created.", "success")
        return redirect(url_for("tenants.tenant_keys", tenant_id=tenant.id))
    return render_template("console/tenant_form.html", values=values, tenant=None, errors={},
                           statuses=TENANT_STATUSES)


@bp.route("/tenants/<int:tenant_id>/edit", methods=["GET", "POST"])
@login_required
def tenant_edit(tenant_id: int):
    tenant = service.get_tenant(current_user, tenant_id)
    require("tenant.manage", tenant.id)
    values = {f: getattr(tenant, f) for f in TENANT_FIELDS}
    if request.method == "POST":
        values = form_data(*TENANT_FIELDS)
        try:
            service.update_tenant(current_user, tenant.id, values)
        except ServiceError as exc:
            if not exc.errors:
                raise
            return render_errors("console/tenant_form.html", exc, values=values,
                                 tenant=tenant, statuses=TENANT_STATUSES)
        flash("Tenant saved.", "success")
        return redirect(url_for("tenants.tenants"))
    return render_template("console/tenant_form.html", values=values, tenant=tenant, errors={},
                           statuses=TENANT_STATUSES)


def _models_for(tenant) -> list[str]:
    """The model names the tenant's clients may send (as the gateway's /v1/models)."""
    from app.catalog.service import list_tiers
    from app.policies.service import effective_policy
    policy = effective_policy(tenant.id)
    names = ["auto"]
    if policy.get("allow_explicit_tier", True):
        allowed = set(policy.get("allowed_tiers") or [])
        names += [t.name for t in list_tiers() if t.enabled and (not allowed or t.name in allowed)]
    return names


@bp.route("/tenants/<int:tenant_id>/keys", methods=["GET", "POST"])
@login_required
def tenant_keys(tenant_id: int):
    """POST creates a key and redirects; the GET after it shows the plaintext once
    (``app.console.reveal``), with the gateway URL and snippets to use it."""
    tenant = service.get_tenant(current_user, tenant_id)
    can_manage = current_user.can("key.manage", tenant.id)
    context = {"tenant": tenant, "can_manage": can_manage, "errors": {},
               "values": {"name": "", "expires_at": ""}, "plaintext": None}
    if request.method == "POST":
        require("key.manage", tenant.id)
        values = form_data("name", "expires_at")
        try:
            key, plaintext = service.create_key(current_user, tenant.id, values)
        except ServiceError as exc:
            if not exc.errors:
                raise
            context.update(values=values)
            return render_errors("console/keys.html", exc, **context)
        reveal.stash("tenant_key", key.id, plaintext)
        return redirect(url_for("tenants.tenant_keys", tenant_id=tenant.id, created=key.id))
    shown = reveal.take("tenant_key")
    if shown is not None:
        key_id, plaintext = shown
        context.update(plaintext=plaintext,
                       new_key=next((k for k in tenant.keys if k.id == key_id), None),
                       gateway_url=current_app.config["GATEWAY_URL"].rstrip("/"),
                       models=_models_for(tenant))
    elif request.args.get("created"):
        flash("The new key was shown once and is no longer available: Sluice keeps only its "
              "hash. Revoke it and create another if it was not copied.", "info")
    return render_template("console/keys.html", **context)


@bp.route("/keys/<int:key_id>/revoke", methods=["POST"])
@login_required
def key_revoke(key_id: int):
    key = service.get_key(current_user, key_id)
    require("key.manage", key.tenant_id)
    service.revoke_key(current_user, key.id)
    flash(f"Key {key.prefix}… revoked.", "success")
    return redirect(url_for("tenants.tenant_keys", tenant_id=key.tenant_id))


# ------------------------------------------------------------------ admin API (/api/v1)

@api_bp.get("/tenants")
@api_auth
def api_tenants_list():
    return jsonify(tenants=[t.to_dict() for t in service.visible_tenants(g.api_user)])


@api_bp.post("/tenants")
@api_auth
def api_tenant_create():
    tenant = service.create_tenant(g.api_user, body())
    return jsonify(tenant.to_dict()), 201


@api_bp.get("/tenants/<int:tenant_id>")
@api_auth
def api_tenant_get(tenant_id: int):
    return jsonify(service.get_tenant(g.api_user, tenant_id).to_dict())


@api_bp.patch("/tenants/<int:tenant_id>")
@api_auth
def api_tenant_update(tenant_id: int):
    return jsonify(service.update_tenant(g.api_user, tenant_id, body()).to_dict())


@api_bp.get("/tenants/<int:tenant_id>/keys")
@api_auth
def api_keys_list(tenant_id: int):
    tenant = service.get_tenant(g.api_user, tenant_id)
    return jsonify(keys=[k.to_dict() for k in tenant.keys])


@api_bp.post("/tenants/<int:tenant_id>/keys")
@api_auth
def api_key_create(tenant_id: int):
    key, plaintext = service.create_key(g.api_user, tenant_id, body())
    # The only response that ever carries the plaintext.
    return jsonify({**key.to_dict(), "key": plaintext}), 201


@api_bp.get("/keys/<int:key_id>")
@api_auth
def api_key_get(key_id: int):
    return jsonify(service.get_key(g.api_user, key_id).to_dict())


@api_bp.delete("/keys/<int:key_id>")
@api_auth
def api_key_revoke(key_id: int):
    return jsonify(service.revoke_key(g.api_user, key_id).to_dict())
