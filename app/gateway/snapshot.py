"""The gateway's view of the control plane: the snapshot JSON from Redis, indexed once
per version. Polled in the background; the hot path only reads ``store.current``."""
from __future__ import annotations

import asyncio
import logging
from datetime import datetime
from typing import Any

import orjson

log = logging.getLogger(__name__)


def _epoch(iso: str | None) -> float | None:
    if not iso:
        return None
    return datetime.fromisoformat(iso).timestamp()


class Snapshot:
    """Read-only indexes over one snapshot version."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data
        self.version = int(data.get("version") or 0)
        self.tenants: dict[str, dict] = data.get("tenants") or {}
        self.keys: dict[str, dict] = {}
        for digest, k in (data.get("keys") or {}).items():
            self.keys[digest] = {**k, "expires_epoch": _epoch(k.get("expires_at"))}
        self.pools: dict[str, dict] = data.get("pools") or {}
        self.workflows: dict[str, dict] = data.get("workflows") or {}
        tiers = sorted(data.get("tiers") or [], key=lambda t: t["rank"])
        self.all_tiers = tiers
        self.tiers = [t for t in tiers if t.get("enabled", True)]
        self.tiers_by_name = {t["name"]: t for t in self.tiers}

    def tenant(self, tenant_id: int | str) -> dict | None:
        return self.tenants.get(str(tenant_id))

    def allowed_tiers(self, tenant: dict) -> list[dict]:
        allowed = tenant["policy"].get("allowed_tiers") or []
        if not allowed:
            return self.tiers
        names = set(allowed)
        return [t for t in self.tiers if t["name"] in names]

    def workflow(self, tenant_id: int, signature: str) -> dict | None:
        return self.workflows.get(f"{tenant_id}:{signature}")

    def replicas(self, tier: dict) -> list[dict]:
        pool = self.pools.get(str(tier.get("pool_id")))
        return list(pool["replicas"]) if pool else []

    def served_model(self, tier: dict) -> str:
        if tier.get("upstream_kind") == "pool":
            pool = self.pools.get(str(tier.get("pool_id")))
            if pool:
                return pool.get("served_model_name") or pool.get("name") or tier["model"]
        return tier["model"]


class SnapshotStore:
    """Holds the current snapshot; ``refresh`` reloads only when the version moved."""

    def __init__(self, redis, version_key: str, data_key: str, poll_s: float = 0.5) -> None:
        self.redis = redis
        self.version_key = version_key
        self.data_key = data_key
        self.poll_s = poll_s
        self.current: Snapshot | None = None
        self.reloads = 0
        self.redis_ok = False
        self.last_error = ""

    async def refresh(self) -> bool:
        """True when a new version was loaded. Never raises: on any failure the last
        snapshot stays in service."""
        try:
            raw_version = await self.redis.get(self.version_key)
            self.redis_ok = True
            if raw_version is None:
                return False
            version = int(raw_version)
            if self.current is not None and version == self.current.version:
                return False
            raw = await self.redis.get(self.data_key)
            if raw is None:
                return False
            snap = Snapshot(orjson.loads(raw))
            if self.current is not None and snap.version < self.current.version:
                return False
            self.current = snap
            self.reloads += 1
            self.last_error = ""
            log.info("gateway snapshot version %s loaded", snap.version)
            return True
        except Exception as exc:  # noqa: BLE001 - Redis down or bad JSON: keep serving
            self.redis_ok = False
            self.last_error = f"{type(exc).__name__}: {exc}"
            log.warning("snapshot refresh failed, serving version %s: %s",
                        self.current.version if self.current else None, exc)
            return False

    async def poll_forever(self, on_tick=None) -> None:
        while True:
            await self.refresh()
            if on_tick is not None:
                await on_tick()
            await asyncio.sleep(self.poll_s)
