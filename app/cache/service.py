"""The cache as the control plane uses it: the app's store, and audited invalidation."""
from __future__ import annotations

from typing import Any

from flask import current_app

from app.audit.service import record
from app.contract.cache.store import CacheStore
from app.errors import Forbidden, ValidationError
from app.extensions import db
from app.redis_client import get_redis
from app.tenants.service import get_tenant
from app.workflows.service import get_workflow


def store_from_config(redis_client: Any, config: dict, *, with_qdrant: bool = True) -> CacheStore:
    """A CacheStore for any process (the gateway passes its own Redis client and settings)."""
    return CacheStore(redis_client, config["REDIS_NAMESPACE"],
                      qdrant_url=config["QDRANT_URL"] if with_qdrant else "",
                      qdrant_path=config["QDRANT_PATH"] if with_qdrant else "")


def get_store() -> CacheStore:
    """The app's store, built once per app."""
    store = current_app.extensions.get("cache_store")
    if store is None:
        store = store_from_config(get_redis(), current_app.config)
        current_app.extensions["cache_store"] = store
    return store


def invalidate_cache(user, tenant_id: int | None = None, workflow: str | None = None, *,
                     workflow_id: int | None = None, everything: bool = False) -> int:
    """Drop cached answers of a tenant, a workflow (by id, or by signature within
    ``tenant_id``), or everything. With no scope a tenant user's call means their own tenant
    and a global user's call means everything; ``everything=True`` says so explicitly and is
    refused to tenant users. Returns how many entries were removed."""
    if workflow_id is not None:
        wf = get_workflow(user, workflow_id)
        tenant_id, workflow = wf.tenant_id, wf.signature
    if everything and (tenant_id is not None or workflow):
        raise ValidationError("invalidating everything takes no tenant or workflow",
                              {"scope": ["'all' takes no tenant or workflow"]})
    scope = tenant_id if tenant_id is not None else (
        None if everything else getattr(user, "tenant_id", None))
    if not user.can("cache.invalidate", scope) or (everything and user.tenant_id is not None):
        raise Forbidden("you may not invalidate this cache")
    if scope is not None:
        get_tenant(user, scope)  # NotFound for a tenant that does not exist
    removed = get_store().invalidate(tenant_id=scope, workflow=workflow or None)
    record(user, "cache.invalidate", "cache", scope or "all", tenant_id=scope,
           after={"tenant_id": scope, "workflow": workflow or None, "removed": removed})
    db.session.commit()
    return removed
