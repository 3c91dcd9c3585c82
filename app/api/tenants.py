"""Admin API: tenants and their gateway API keys."""
from __future__ import annotations

from flask import g, jsonify

from app.api.views import api_auth, body, bp
from app.tenants import service


@bp.get("/tenants")
@api_auth
def tenants_list():
    return jsonify(tenants=[t.to_dict() for t in service.visible_tenants(g.api_user)])


@bp.post("/tenants")
@api_auth
def tenant_create():
    tenant = service.create_tenant(g.api_user, body())
    return jsonify(tenant.to_dict()), 201


@bp.get("/tenants/<int:tenant_id>")
@api_auth
def tenant_get(tenant_id: int):
    return jsonify(service.get_tenant(g.api_user, tenant_id).to_dict())


@bp.patch("/tenants/<int:tenant_id>")
@api_auth
def tenant_update(tenant_id: int):
    return jsonify(service.update_tenant(g.api_user, tenant_id, body()).to_dict())


@bp.get("/tenants/<int:tenant_id>/keys")
@api_auth
def keys_list(tenant_id: int):
    tenant = service.get_tenant(g.api_user, tenant_id)
    return jsonify(keys=[k.to_dict() for k in tenant.keys])


@bp.post("/tenants/<int:tenant_id>/keys")
@api_auth
def key_create(tenant_id: int):
    key, plaintext = service.create_key(g.api_user, tenant_id, body())
    # The only response that ever carries the plaintext.
    return jsonify({**key.to_dict(), "key": plaintext}), 201


@bp.get("/keys/<int:key_id>")
@api_auth
def key_get(key_id: int):
    return jsonify(service.get_key(g.api_user, key_id).to_dict())


@bp.delete("/keys/<int:key_id>")
@api_auth
def key_revoke(key_id: int):
    return jsonify(service.revoke_key(g.api_user, key_id).to_dict())
