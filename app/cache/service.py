"""The cache as the control plane uses it: the app's store, and audited invalidation."""
from __future__ import annotations

from decimal import Decimal
from typing import Any

from flask import current_app

from app.audit.service import record
from app.contract.cache.quality import CacheQuality
from app.contract.cache.store import CacheStore
from app.core.cache_bound import Evidence
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


QUALITY_DAYS = 7


def verification_cost(tenant_ids: list[int], since) -> dict[tuple[int, str], tuple[int, Decimal]]:
    """What sampled cache verification cost since ``since``, per (tenant, workflow): the
    runs and the exact sum of their ``cache_verify`` ledger rows (``app.gateway.
    cache_verify``; off the path, so on no budget or FinOps total)."""
    from sqlalchemy import func, select

    from app.ledger.models import LedgerEntry
    q = (select(LedgerEntry.tenant_id, LedgerEntry.workflow, func.count(),
                func.coalesce(func.sum(LedgerEntry.cost_usd), 0))
         .where(LedgerEntry.at >= since, LedgerEntry.tenant_id.in_(tenant_ids),
                LedgerEntry.kind == "cache_verify")
         .group_by(LedgerEntry.tenant_id, LedgerEntry.workflow))
    return {(tenant_id, workflow or ""): (int(n), Decimal(cost))
            for tenant_id, workflow, n, cost in db.session.execute(q)}


def cache_quality(user) -> list[dict]:
    """Per tenant and workflow the user may see: requests and hits over the last
    QUALITY_DAYS days (the ledger), hits by how they were judged, verification evidence
    (the measured error of verified-path candidates with its 95% interval), the tenant's
    bound and line, evictions (the verified cache's Redis counters), and what the sampled
    verification runs cost (``verify_cost``: an exact Decimal, shown with
    ``costing.format_usd`` as FinOps shows its cache-verification line)."""
    from datetime import timedelta

    from sqlalchemy import func, select

    from app.ledger.models import LedgerEntry
    from app.policies.service import effective_policy
    from app.tenants.service import visible_tenants
    from app.models_base import utcnow
    tenants = {t.id: t for t in visible_tenants(user)}
    if not tenants:
        return []
    since = utcnow() - timedelta(days=QUALITY_DAYS)
    counts: dict[tuple[int, str], dict] = {}
    q = (select(LedgerEntry.tenant_id, LedgerEntry.workflow, LedgerEntry.cache, func.count())
         .where(LedgerEntry.at >= since, LedgerEntry.tenant_id.in_(list(tenants)),
                LedgerEntry.kind == "request")
         .group_by(LedgerEntry.tenant_id, LedgerEntry.workflow, LedgerEntry.cache))
    for tenant_id, workflow, cache, n in db.session.execute(q):
        row = counts.setdefault((tenant_id, workflow or ""), {"requests": 0, "exact": 0,
                                                              "semantic": 0})
        row["requests"] += n
        if cache in ("exact", "semantic"):
            row[cache] += n
    stats = {}
    quality = CacheQuality(get_redis(), current_app.config["REDIS_NAMESPACE"])
    for r in quality.rows():
        try:
            stats[(int(r["tenant"]), r["workflow"])] = r
        except ValueError:
            continue
    verify = verification_cost(list(tenants), since)
    out = []
    policies: dict[int, dict] = {}
    for key in sorted(set(counts) | set(verify) | {k for k in stats if k[0] in tenants}):
        tenant_id, workflow = key
        pol = policies.setdefault(tenant_id, effective_policy(tenant_id))
        c = counts.get(key, {"requests": 0, "exact": 0, "semantic": 0})
        verify_runs, verify_cost = verify.get(key, (0, Decimal(0)))
        st = stats.get(key, {})
        ev = Evidence.from_fields(st)
        n, k, rate, lo, hi = ev.measured()
        bound = float(pol["cache_error_bound"])
        tenant_ev = quality.evidence(tenant_id)
        line = tenant_ev.line(bound, float(pol["cache_verify_floor"]),
                              float(pol["cache_similarity_threshold"]))
        hits = c["exact"] + c["semantic"]
        semantic = st.get("hits_fast", 0) + st.get("hits_verified", 0)
        out.append({
            "tenant_id": tenant_id, "tenant": tenants[tenant_id].name, "workflow": workflow,
            "requests": c["requests"], "hits": hits,
            "hit_rate": hits / c["requests"] if c["requests"] else None,
            "hits_exact": st.get("hits_exact", 0), "hits_fast": st.get("hits_fast", 0),
            "hits_verified": st.get("hits_verified", 0),
            "share_verified": st.get("hits_verified", 0) / semantic if semantic else None,
            "checked": n, "wrong": k, "error": rate if n else None, "error_low": lo,
            "error_high": hi if n else None, "bound": bound, "line": line,
            "verified_entries": st.get("verified", 0), "evicted": st.get("evicted", 0),
            "verify_runs": verify_runs, "verify_cost": verify_cost})
    return out
