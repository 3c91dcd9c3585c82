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

from app.contract.snapshot import (KeyEntry, PoolEntry, PriceChange, ReplicaEntry,
                                    SnapshotData, TenantEntry, TierEntry, WorkflowEntry)
from app.extensions import db

log = logging.getLogger(__name__)


def build_snapshot() -> dict[str, Any]:
    """The snapshot's JSON (``SnapshotData.to_json``) as of now, from SQL."""
    from app.adapters.serving import snapshot_entries
    from app.catalog.models import Pool, Tier
    from app.contract import policy as schema
    from app.finops.prices import snapshot_schedules
    from app.policies.models import Policy
    from app.tenants.models import ApiKey, Tenant
    from app.workflows.models import Workflow

    policies = {p.tenant_id: dict(p.values) for p in db.session.scalars(db.select(Policy))}
    global_policy = policies.get(None, {})
    tenants = {str(t.id): TenantEntry(t.id, t.name, t.department, t.status,
                                      schema.effective(global_policy, policies.get(t.id)))
               for t in db.session.scalars(db.select(Tenant))}
    keys = {k.key_hash: KeyEntry(k.id, k.tenant_id, k.prefix,
                                 k.expires_at.isoformat() if k.expires_at else None)
            for k in db.session.scalars(db.select(ApiKey).where(ApiKey.revoked_at.is_(None)))}
    pools = {str(p.id): PoolEntry(
        id=p.id, name=p.name, engine=p.engine, model=p.model,
        served_model_name=p.served_model_name or p.name, replicas=tuple(ReplicaEntry(r.id, r.name, r.url, r.state, r.weight)
              for r in p.replicas if r.state != "stopped"))
        for p in db.session.scalars(db.select(Pool))}
    schedules = snapshot_schedules()  # effective-dated price changes (app.core.pricing)
    tiers = tuple(TierEntry(
        id=t.id, name=t.name, rank=t.rank, model=t.model,
        price_input_per_m=str(t.price_input_per_m),
        price_cached_input_per_m=str(t.price_cached_input_per_m),
        price_output_per_m=str(t.price_output_per_m),
        price_schedule=tuple(PriceChange.from_json(c) for c in schedules.get(t.id, [])),
        upstream_kind=t.upstream_kind, pool_id=t.pool_id, endpoint_url=t.endpoint_url,
        api_key_env=t.api_key_env, timeout_s=t.timeout_s, enabled=t.enabled,
        margin_gamma=t.margin_gamma)
        for t in db.session.scalars(db.select(Tier).order_by(Tier.rank)))
    workflows = {f"{w.tenant_id}:{w.signature}": WorkflowEntry(
        w.id, w.name, w.category, w.first_seen_at.isoformat())
        for w in db.session.scalars(db.select(Workflow))}
    return SnapshotData(tenants=tenants, keys=keys, tiers=tiers, pools=pools,
                        workflows=workflows,
                        global_policy=schema.effective(global_policy, None),
                        adapters=snapshot_entries()).to_json()


# Store the build only if it is newer than the stored one (compare-and-set): KEYS data,
# version, channel; ARGV version, data. Returns the version now stored.
_CAS = """
local stored = tonumber(redis.call('GET', KEYS[2]) or '0')
local mine = tonumber(ARGV[1])
if mine <= stored then return stored end
redis.call('SET', KEYS[1], ARGV[2])
redis.call('SET', KEYS[2], ARGV[1])
redis.call('PUBLISH', KEYS[3], ARGV[1])
return mine
"""


def publish() -> int:
    """Build the snapshot and store it in Redis; returns the version stored after it.

    The version is taken before the build reads the database, and the build is stored
    only if no newer one is (compare-and-set): of two publishes that race, the one that
    read later wins whatever order they finish in, so a key revoked between them can never
    come back with the older build."""
    version = next_version()
    return store(version, build_snapshot())


def next_version() -> int:
    """A version for a build about to read the database (before it reads)."""
    from app.redis_client import get_redis, keys
    r, k = get_redis(), keys()
    seq = r.incr(k.snapshot_seq())
    stored = int(r.get(k.snapshot_version()) or 0)
    if seq <= stored:   # stored by an older release that bumped the version directly
        seq = r.incrby(k.snapshot_seq(), stored - seq + 1)
    return int(seq)


def store(version: int, snap: dict) -> int:
    """Store ``snap`` as ``version`` unless a newer build is stored; returns the version
    stored after the call (``version`` when this build won)."""
    from app.redis_client import get_redis, keys
    r, k = get_redis(), keys()
    snap["version"] = version
    return int(r.eval(_CAS, 3, k.snapshot_data(), k.snapshot_version(), k.snapshot_changed(),
                      version, json.dumps(snap, separators=(",", ":"))))


def publish_after_commit() -> int | None:
    """Publish, but never fail the caller's already-committed change if Redis is down:
    the periodic ``snapshot.publish`` task catches up."""
    if current_app.config["SNAPSHOT_PUBLISH"] is False:
        return None
    try:
        return publish()
    except Exception as exc:  # noqa: BLE001 - Redis outage must not undo a committed change
        log.warning("snapshot publish failed (will retry from beat): %s", exc)
        return None
