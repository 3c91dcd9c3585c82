"""The gateway's config snapshot: everything the data path needs, built from SQL,
stored in Redis under a version number that bumps on every change.

Gateways poll the version (one GET) and reload the JSON only when it changed, so
the hot path never touches SQL and keeps serving the last snapshot if SQL or Redis
is down.
"""
from __future__ import annotations

import json
import logging
from typing import Any

from flask import current_app

from app.extensions import db

log = logging.getLogger(__name__)


def build_snapshot() -> dict[str, Any]:
    from app.catalog.models import Pool, Tier
    from app.policies import schema
    from app.policies.models import Policy
    from app.tenants.models import ApiKey, Tenant
    from app.workflows.models import Workflow

    policies = {p.tenant_id: dict(p.values) for p in db.session.scalars(db.select(Policy))}
    global_policy = policies.get(None, {})
    tenants = {}
    for t in db.session.scalars(db.select(Tenant)):
        tenants[str(t.id)] = {
            "id": t.id, "name": t.name, "department": t.department, "status": t.status,
            "policy": schema.effective(global_policy, policies.get(t.id)),
        }
    keys = {}
    for k in db.session.scalars(db.select(ApiKey).where(ApiKey.revoked_at.is_(None))):
        keys[k.key_hash] = {"id": k.id, "tenant_id": k.tenant_id, "prefix": k.prefix,
                            "expires_at": k.expires_at.isoformat() if k.expires_at else None}
    pools = {}
    for p in db.session.scalars(db.select(Pool)):
        pools[str(p.id)] = {
            "id": p.id, "name": p.name, "engine": p.engine, "model": p.model,
            "served_model_name": p.served_model_name or p.name,
            "replicas": [{"id": r.id, "name": r.name, "url": r.url, "state": r.state,
                          "weight": r.weight} for r in p.replicas if r.state != "stopped"],
        }
    from app.finops.prices import snapshot_schedules
    schedules = snapshot_schedules()  # effective-dated price changes (app.core.pricing)
    tiers = []
    for t in db.session.scalars(db.select(Tier).order_by(Tier.rank)):
        tiers.append({
            "id": t.id, "name": t.name, "rank": t.rank, "model": t.model,
            "price_input_per_m": str(t.price_input_per_m),
            "price_cached_input_per_m": str(t.price_cached_input_per_m),
            "price_output_per_m": str(t.price_output_per_m),
            "price_schedule": schedules.get(t.id, []),
            "upstream_kind": t.upstream_kind,
            "pool_id": t.pool_id, "endpoint_url": t.endpoint_url,
            "api_key_env": t.api_key_env, "timeout_s": t.timeout_s, "enabled": t.enabled,
        })
    workflows = {f"{w.tenant_id}:{w.signature}": {"id": w.id, "name": w.name,
                                                  "category": w.category,
                                                  "first_seen_at": w.first_seen_at.isoformat()}
                 for w in db.session.scalars(db.select(Workflow))}
    return {"tenants": tenants, "keys": keys, "tiers": tiers, "pools": pools,
            "global_policy": schema.effective(global_policy, None), "workflows": workflows}


def publish() -> int:
    """Build the snapshot and store it in Redis; returns the new version."""
    from app.redis_client import get_redis, keys
    snap = build_snapshot()
    r = get_redis()
    k = keys()
    version = r.incr(k.k("snapshot", "version"))
    snap["version"] = version
    pipe = r.pipeline()
    pipe.set(k.k("snapshot", "data"), json.dumps(snap, separators=(",", ":")))
    pipe.publish(k.k("snapshot", "changed"), version)
    pipe.execute()
    return version


def publish_after_commit() -> int | None:
    """Publish, but never fail the caller's already-committed change if Redis is down:
    the periodic ``snapshot.publish`` task catches up."""
    if current_app.config.get("SNAPSHOT_PUBLISH", True) is False:
        return None
    try:
        return publish()
    except Exception as exc:  # noqa: BLE001 - Redis outage must not undo a committed change
        log.warning("snapshot publish failed (will retry from beat): %s", exc)
        return None
