"""Admin API: policies, users, audit log, workflows and the caller's own API tokens."""
from __future__ import annotations

from flask import abort, g, jsonify, request

from app.api.views import api_auth, body, bp, int_arg
from app.audit.service import list_entries
from app.auth import service as auth
from app.auth.models import User
from app.errors import NotFound
from app.extensions import db
from app.policies import service as policies
from app.tenants.service import get_tenant
from app.workflows import service as workflows


def _policy(tenant_id: int | None) -> dict:
    own = policies.tenant_values(tenant_id) if tenant_id else policies.global_values()
    return {"tenant_id": tenant_id, "values": own,
            "effective": policies.effective_policy(tenant_id)}


@bp.get("/policies/global")
@api_auth
def policy_global_get():
    return jsonify(_policy(None))


@bp.route("/policies/global", methods=["PATCH", "PUT"])
@api_auth
def policy_global_update():
    """PATCH merges the given fields; PUT replaces the whole set."""
    policies.update_policy(g.api_user, None, body(), replace=request.method == "PUT")
    return jsonify(_policy(None))


@bp.get("/tenants/<int:tenant_id>/policy")
@api_auth
def policy_tenant_get(tenant_id: int):
    get_tenant(g.api_user, tenant_id)
    return jsonify(_policy(tenant_id))


@bp.route("/tenants/<int:tenant_id>/policy", methods=["PATCH", "PUT"])
@api_auth
def policy_tenant_update(tenant_id: int):
    """PATCH merges (null or "" clears a field back to inherited); PUT replaces."""
    policies.update_policy(g.api_user, tenant_id, body(), replace=request.method == "PUT")
    return jsonify(_policy(tenant_id))


@bp.get("/users")
@api_auth
def users_list():
    return jsonify(users=[u.to_dict() for u in auth.list_users(g.api_user)])


@bp.post("/users")
@api_auth
def user_create():
    return jsonify(auth.create_user(g.api_user, body()).to_dict()), 201


def _user(user_id: int) -> User:
    if not g.api_user.can("user.manage"):
        abort(403)
    user = db.session.get(User, user_id)
    if user is None:
        raise NotFound("no such user")
    return user


@bp.get("/users/<int:user_id>")
@api_auth
def user_get(user_id: int):
    return jsonify(_user(user_id).to_dict())


@bp.patch("/users/<int:user_id>")
@api_auth
def user_update(user_id: int):
    data = body()
    _user(user_id)
    return jsonify(auth.update_user(g.api_user, user_id, data).to_dict())


@bp.get("/audit")
@api_auth
def audit_list():
    if not g.api_user.can("audit.read"):
        abort(403)
    entries = list_entries(g.api_user, limit=int_arg("limit", 200, 1, 1000),
                           action=request.args.get("action") or None)
    return jsonify(entries=[e.to_dict() for e in entries])


@bp.get("/workflows")
@api_auth
def workflows_list():
    return jsonify(workflows=[w.to_dict() for w in workflows.list_workflows(g.api_user)])


@bp.get("/workflows/<int:workflow_id>")
@api_auth
def workflow_get(workflow_id: int):
    return jsonify(workflows.get_workflow(g.api_user, workflow_id).to_dict())


@bp.patch("/workflows/<int:workflow_id>")
@api_auth
def workflow_update(workflow_id: int):
    return jsonify(workflows.update_workflow(g.api_user, workflow_id, body()).to_dict())


def _token(row) -> dict:
    return {"id": row.id, "name": row.name, "prefix": row.prefix,
            "created_at": row.created_at.isoformat(),
            "revoked_at": row.revoked_at.isoformat() if row.revoked_at else None}


@bp.get("/tokens")
@api_auth
def tokens_list():
    return jsonify(tokens=[_token(t) for t in auth.list_admin_tokens(g.api_user)])


@bp.post("/tokens")
@api_auth
def token_create():
    data = request.get_json(silent=True) or {}
    row, plaintext = auth.create_admin_token(g.api_user, str(data.get("name") or ""))
    return jsonify({**_token(row), "token": plaintext}), 201


@bp.delete("/tokens/<int:token_id>")
@api_auth
def token_revoke(token_id: int):
    return jsonify(_token(auth.revoke_admin_token(g.api_user, token_id)))
