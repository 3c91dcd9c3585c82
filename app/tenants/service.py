"""Tenant and API key operations. Each public function is one unit of work."""
from __future__ import annotations

from datetime import datetime, timezone

from app.audit.service import record
from app.errors import Conflict, Forbidden, NotFound, ValidationError
from app.extensions import db
from app.models_base import utcnow
from app.security import KEY_PREFIX, new_token
from app.snapshot.service import publish_after_commit
from app.tenants.models import TENANT_STATUSES, ApiKey, Tenant


def _require(user, permission: str, tenant_id: int | None = None) -> None:
    if not user.can(permission, tenant_id):
        raise Forbidden(f"your role ({user.role}) may not do this")


def visible_tenants(user) -> list[Tenant]:
    q = db.select(Tenant).order_by(Tenant.name)
    if user.tenant_id is not None:
        q = q.where(Tenant.id == user.tenant_id)
    return list(db.session.scalars(q))


def get_tenant(user, tenant_id: int) -> Tenant:
    tenant = db.session.get(Tenant, tenant_id)
    if tenant is None or not user.sees_tenant(tenant.id):
        raise NotFound("no such tenant")  # never confirm another tenant exists
    return tenant


def _clean_tenant(data: dict, *, partial: bool) -> dict:
    errors: dict[str, list[str]] = {}
    clean: dict = {}
    if "name" in data or not partial:
        name = str(data.get("name") or "").strip()
        if not name:
            errors["name"] = ["is required"]
        elif len(name) > 100:
            errors["name"] = ["must be at most 100 characters"]
        else:
            clean["name"] = name
    if "department" in data:
        dept = str(data.get("department") or "").strip()
        if len(dept) > 100:
            errors["department"] = ["must be at most 100 characters"]
        clean["department"] = dept
    if "status" in data:
        if data["status"] not in TENANT_STATUSES:
            errors["status"] = [f"must be one of {', '.join(TENANT_STATUSES)}"]
        else:
            clean["status"] = data["status"]
    if errors:
        raise ValidationError("invalid tenant", errors)
    return clean


def create_tenant(user, data: dict) -> Tenant:
    if user.tenant_id is not None:
        raise Forbidden("a tenant-scoped user cannot create tenants")
    _require(user, "tenant.manage")
    clean = _clean_tenant(data, partial=False)
    if db.session.scalar(db.select(Tenant).where(Tenant.name == clean["name"])):
        raise Conflict("a tenant with this name exists", {"name": ["is already taken"]})
    tenant = Tenant(**clean)
    db.session.add(tenant)
    db.session.flush()
    record(user, "tenant.create", "tenant", tenant.id, tenant_id=tenant.id, after=tenant.to_dict())
    db.session.commit()
    publish_after_commit()
    return tenant


def update_tenant(user, tenant_id: int, data: dict) -> Tenant:
    tenant = get_tenant(user, tenant_id)
    _require(user, "tenant.manage", tenant.id)
    clean = _clean_tenant(data, partial=True)
    if user.tenant_id is not None and clean.get("status", tenant.status) != tenant.status:
        raise Forbidden("a tenant's status is set by central ops",
                        {"status": ["set by central ops"]})
    if "name" in clean and clean["name"] != tenant.name and db.session.scalar(
            db.select(Tenant).where(Tenant.name == clean["name"])):
        raise Conflict("a tenant with this name exists", {"name": ["is already taken"]})
    before = tenant.to_dict()
    for k, v in clean.items():
        setattr(tenant, k, v)
    record(user, "tenant.update", "tenant", tenant.id, tenant_id=tenant.id, before=before,
           after=tenant.to_dict())
    db.session.commit()
    publish_after_commit()
    return tenant


def create_key(user, tenant_id: int, data: dict) -> tuple[ApiKey, str]:
    """Create a gateway key; returns (row, plaintext). The plaintext is never stored."""
    tenant = get_tenant(user, tenant_id)
    _require(user, "key.manage", tenant.id)
    errors: dict[str, list[str]] = {}
    name = str(data.get("name") or "").strip()
    if not name:
        errors["name"] = ["is required"]
    elif len(name) > 100:
        errors["name"] = ["must be at most 100 characters"]
    expires_at = data.get("expires_at")
    if isinstance(expires_at, str) and expires_at.strip():
        try:
            expires_at = datetime.fromisoformat(expires_at.strip())
        except ValueError:
            errors["expires_at"] = ["must be an ISO date or datetime"]
    elif not expires_at:
        expires_at = None
    if isinstance(expires_at, datetime):
        if expires_at.tzinfo is None:
            expires_at = expires_at.replace(tzinfo=timezone.utc)
        if expires_at <= utcnow():
            errors["expires_at"] = ["must be in the future"]
    if errors:
        raise ValidationError("invalid key", errors)
    plaintext, prefix, digest = new_token(KEY_PREFIX)
    key = ApiKey(tenant_id=tenant.id, name=name, prefix=prefix, key_hash=digest,
                 expires_at=expires_at)
    db.session.add(key)
    db.session.flush()
    record(user, "key.create", "api_key", key.id, tenant_id=tenant.id, after=key.to_dict())
    db.session.commit()
    publish_after_commit()
    return key, plaintext


def get_key(user, key_id: int) -> ApiKey:
    key = db.session.get(ApiKey, key_id)
    if key is None or not user.sees_tenant(key.tenant_id):
        raise NotFound("no such key")
    return key


def revoke_key(user, key_id: int) -> ApiKey:
    key = get_key(user, key_id)
    _require(user, "key.manage", key.tenant_id)
    if key.revoked_at is not None:
        raise Conflict("key is already revoked")
    before = key.to_dict()
    key.revoked_at = utcnow()
    record(user, "key.revoke", "api_key", key.id, tenant_id=key.tenant_id, before=before,
           after=key.to_dict())
    db.session.commit()
    publish_after_commit()
    return key
