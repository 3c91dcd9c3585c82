"""The config snapshot: everything the data path needs from the control plane, typed.

The control plane builds a ``SnapshotData`` from SQL (``app.snapshot.service``), writes
``to_json()`` under ``Keys.snapshot_data()`` and moves ``Keys.snapshot_version()`` to its
version, only forward (compare-and-set: an older build never replaces a newer one).
Gateways poll the version (one GET), load the JSON only when it moved
(``SnapshotStore``) and index it once per version (``Snapshot``); the hot path only reads
``store.current``. Both sides go through the same dataclasses, so a field added on one
side and not the other fails at build or parse, not in a request.

Entries are frozen dataclasses that also read as mappings (``tier["rank"]``,
``tier.get("endpoint_url")``), so the pure functions of ``app.core`` that take plain
mappings take them as they are.

``SCHEMA`` is the shape's version: a gateway refuses a snapshot of another shape and
keeps serving the one it has.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator, Mapping
from dataclasses import MISSING, dataclass, field, fields
from datetime import datetime
from typing import Any

import orjson

from app.contract import policy as policy_schema

log = logging.getLogger(__name__)
SCHEMA = 1


class _Entry(Mapping):
    """Read-only mapping access to a frozen dataclass's fields, as fast as a dict's (the
    hot path reads entries a few hundred times per request): the fields are mirrored
    once, at construction, in a private dict."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "_fields", {n: getattr(self, n) for n in self._names()})

    def __getitem__(self, name: str) -> Any:
        return self._fields[name]

    def get(self, name: str, default: Any = None) -> Any:
        return self._fields.get(name, default)

    def __contains__(self, name: object) -> bool:
        return name in self._fields

    def __iter__(self) -> Iterator[str]:
        return iter(self._fields)

    def __len__(self) -> int:
        return len(self._fields)

    def keys(self):
        return self._fields.keys()

    def items(self):
        return self._fields.items()

    def values(self):
        return self._fields.values()

    @classmethod
    def _names(cls) -> tuple[str, ...]:
        names = cls.__dict__.get("_field_names")
        if names is None:
            names = tuple(f.name for f in fields(cls))
            cls._field_names = names
        return names

    def to_json(self) -> dict[str, Any]:
        return {n: _jsonable(getattr(self, n)) for n in self._names()}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]):
        known = {f.name for f in fields(cls)}
        missing = [f.name for f in fields(cls) if f.name not in raw
                   and f.default is MISSING and f.default_factory is MISSING]
        if missing:
            raise ValueError(f"{cls.__name__}: missing {', '.join(missing)}")
        return cls(**{k: v for k, v in raw.items() if k in known})


def _jsonable(value: Any) -> Any:
    if isinstance(value, _Entry):
        return value.to_json()
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _jsonable(v) for k, v in value.items()}
    return value


def _epoch(iso: str | None) -> float | None:
    return datetime.fromisoformat(iso).timestamp() if iso else None


@dataclass(frozen=True)
class TenantEntry(_Entry):
    id: int
    name: str
    department: str | None
    status: str                           # active | suspended
    policy: Mapping[str, Any]             # effective: defaults < global < tenant

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> TenantEntry:
        entry = super().from_json(raw)
        # every policy field present, so no reader needs a default of its own
        return cls(entry.id, entry.name, entry.department, entry.status,
                   policy_schema.effective(None, entry.policy))


@dataclass(frozen=True)
class KeyEntry(_Entry):
    id: int
    tenant_id: int
    prefix: str
    expires_at: str | None                # ISO 8601
    expires_epoch: float | None = None    # derived at parse

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> KeyEntry:
        entry = super().from_json(raw)
        return cls(entry.id, entry.tenant_id, entry.prefix, entry.expires_at,
                   _epoch(entry.expires_at))

    def to_json(self) -> dict[str, Any]:
        out = super().to_json()
        out.pop("expires_epoch")
        return out


@dataclass(frozen=True)
class ReplicaEntry(_Entry):
    id: int
    name: str
    url: str
    state: str
    weight: float = 1.0


@dataclass(frozen=True)
class PoolEntry(_Entry):
    id: int
    name: str
    served_model_name: str
    engine: str = ""
    model: str = ""
    replicas: tuple[ReplicaEntry, ...] = ()

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> PoolEntry:
        entry = super().from_json(raw)
        return cls(entry.id, entry.name, entry.served_model_name, entry.engine, entry.model,
                   tuple(ReplicaEntry.from_json(r) for r in entry.replicas))


@dataclass(frozen=True)
class PriceChange(_Entry):
    """An effective-dated price change (``app.core.pricing``), per 1M tokens."""

    from_ts: float
    price_input_per_m: str
    price_cached_input_per_m: str
    price_output_per_m: str


@dataclass(frozen=True)
class TierEntry(_Entry):
    name: str
    rank: int                             # 1 cheapest .. highest = the frontier baseline
    model: str
    upstream_kind: str                    # pool | external
    id: int | None = None
    price_input_per_m: str = "0"          # USD per 1M tokens, decimal strings: exact
    price_cached_input_per_m: str = "0"
    price_output_per_m: str = "0"
    pool_id: int | None = None
    endpoint_url: str | None = None
    api_key_env: str | None = None
    timeout_s: float | None = None
    enabled: bool = True
    price_schedule: tuple[PriceChange, ...] = ()
    margin_gamma: float | None = None     # calibrated S04 γ for this tier (else the policy's)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> TierEntry:
        entry = super().from_json(raw)
        schedule = tuple(PriceChange.from_json(c) for c in entry.price_schedule)
        return cls(**{**{n: getattr(entry, n) for n in cls._names()},
                      "price_schedule": schedule})


@dataclass(frozen=True)
class WorkflowEntry(_Entry):
    id: int
    name: str
    category: str | None
    first_seen_at: str                    # ISO 8601


@dataclass(frozen=True)
class ShadowEntry(_Entry):
    """A workflow's adapter in shadow: evaluated on a share of the answers a higher tier
    served (``app.gateway.shadow``), never served to a client."""

    name: str                             # the engine's lora_name
    sample_pct: float = 100.0             # share of eligible answers shadowed
    pool_id: int | None = None
    replicas_loaded: tuple[int, ...] = ()  # replica ids where the engine loaded it

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> ShadowEntry:
        entry = super().from_json(raw)
        return cls(entry.name, float(entry.sample_pct), entry.pool_id,
                   tuple(int(r) for r in entry.replicas_loaded))


@dataclass(frozen=True)
class AdapterEntry(_Entry):
    """What a workflow's tier-1 requests are served with (``app.gateway.adapters``): its
    promoted adapter, or a canary sharing ``canary_pct`` of the routing keys with
    ``previous_name`` (the promoted one, or the base model when None). ``name`` is None
    when the workflow only has an adapter in shadow. ``forms``: adapter name -> the served
    form it learned (``app.contract.policy.FORM_FIELDS``), for each of the three that
    has one."""

    name: str | None
    state: str | None                     # canary | promoted (None: shadow only)
    canary_pct: int = 0
    pool_id: int | None = None
    replicas_loaded: tuple[int, ...] = ()
    previous_name: str | None = None
    previous_replicas_loaded: tuple[int, ...] = ()
    shadow: ShadowEntry | None = None
    forms: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> AdapterEntry:
        entry = super().from_json(raw)
        return cls(entry.name, entry.state, int(entry.canary_pct or 0), entry.pool_id,
                   tuple(int(r) for r in entry.replicas_loaded), entry.previous_name,
                   tuple(int(r) for r in entry.previous_replicas_loaded),
                   ShadowEntry.from_json(entry.shadow) if entry.shadow else None,
                   {str(k): dict(v) for k, v in (entry.forms or {}).items() if v})


@dataclass(frozen=True)
class SnapshotData:
    """One snapshot as the control plane builds it and the gateway parses it."""

    tenants: Mapping[str, TenantEntry]            # by str(tenant id)
    keys: Mapping[str, KeyEntry]                  # by key hash
    tiers: tuple[TierEntry, ...]
    pools: Mapping[str, PoolEntry]                # by str(pool id)
    workflows: Mapping[str, WorkflowEntry]        # by "<tenant id>:<signature>"
    global_policy: Mapping[str, Any]
    version: int = 0
    adapters: Mapping[str, AdapterEntry] = field(default_factory=dict)  # "<tenant>:<sig>"

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "version": self.version,
                "tenants": {k: v.to_json() for k, v in self.tenants.items()},
                "keys": {k: v.to_json() for k, v in self.keys.items()},
                "tiers": [t.to_json() for t in self.tiers],
                "pools": {k: v.to_json() for k, v in self.pools.items()},
                "workflows": {k: v.to_json() for k, v in self.workflows.items()},
                "global_policy": dict(self.global_policy),
                "adapters": {k: v.to_json() for k, v in self.adapters.items()}}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> SnapshotData:
        schema = raw.get("schema", SCHEMA)
        if schema != SCHEMA:
            raise ValueError(f"snapshot schema {schema} (this process reads {SCHEMA})")
        return cls(
            tenants={k: TenantEntry.from_json(v) for k, v in (raw.get("tenants") or {}).items()},
            keys={k: KeyEntry.from_json(v) for k, v in (raw.get("keys") or {}).items()},
            tiers=tuple(TierEntry.from_json(t) for t in raw.get("tiers") or ()),
            pools={k: PoolEntry.from_json(v) for k, v in (raw.get("pools") or {}).items()},
            workflows={k: WorkflowEntry.from_json(v)
                       for k, v in (raw.get("workflows") or {}).items()},
            global_policy=policy_schema.effective(raw.get("global_policy"), None),
            version=int(raw.get("version") or 0),
            # a snapshot from before adapters has none
            adapters={k: AdapterEntry.from_json(v)
                      for k, v in (raw.get("adapters") or {}).items()})


class Snapshot:
    """Read-only indexes over one snapshot version (the gateway's view)."""

    def __init__(self, data: Mapping[str, Any] | SnapshotData) -> None:
        typed = data if isinstance(data, SnapshotData) else SnapshotData.from_json(data)
        self.data = typed
        self.version = typed.version
        self.tenants: Mapping[str, TenantEntry] = typed.tenants
        self.keys: Mapping[str, KeyEntry] = typed.keys
        self.pools: Mapping[str, PoolEntry] = typed.pools
        self.workflows: Mapping[str, WorkflowEntry] = typed.workflows
        self.adapters: Mapping[str, AdapterEntry] = typed.adapters
        tiers = sorted(typed.tiers, key=lambda t: t.rank)
        self.all_tiers = tiers
        self.tiers = [t for t in tiers if t.enabled]
        self.tiers_by_name = {t.name: t for t in self.tiers}

    def tenant(self, tenant_id: int | str) -> TenantEntry | None:
        return self.tenants.get(str(tenant_id))

    def allowed_tiers(self, tenant: Mapping[str, Any]) -> list[TierEntry]:
        allowed = tenant["policy"]["allowed_tiers"]
        if not allowed:
            return self.tiers
        names = set(allowed)
        return [t for t in self.tiers if t.name in names]

    def workflow(self, tenant_id: int, signature: str) -> WorkflowEntry | None:
        return self.workflows.get(f"{tenant_id}:{signature}")

    def adapter(self, tenant_id: int, signature: str) -> AdapterEntry | None:
        return self.adapters.get(f"{tenant_id}:{signature}") if self.adapters else None

    def replicas(self, tier: Mapping[str, Any]) -> list[ReplicaEntry]:
        pool = self.pools.get(str(tier.get("pool_id")))
        return list(pool.replicas) if pool else []

    def served_model(self, tier: Mapping[str, Any]) -> str:
        if tier.get("upstream_kind") == "pool":
            pool = self.pools.get(str(tier.get("pool_id")))
            if pool:
                return pool.served_model_name or pool.name or tier["model"]
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
