"""Tiers and pools: validation, changes (audited) and reads."""
from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Any, Callable

from app.audit.service import record
from app.contract.secrets import PROVIDER_KEY_PREFIX, is_provider_key_name
from app.catalog.models import ENGINES, UPSTREAM_KINDS, Pool, Replica, Tier
from app.errors import Conflict, Forbidden, NotFound, ValidationError
from app.extensions import db
from app.models_base import row_id
from app.snapshot.service import publish_after_commit
from workers.pools.vllm_cmd import validate_options

_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
# What decides where the gateway sends a tier's requests and with which credential:
# changing it is an admin's decision (secret.manage), audited on its own.
UPSTREAM_FIELDS = ("upstream_kind", "endpoint_url", "api_key_env")


def _require(user, permission: str) -> None:
    if not user.can(permission):
        raise Forbidden(f"your role ({user.role}) may not do this")


def blended_price(tier: Tier) -> Decimal:
    """USD per 1M tokens at the usual 3:1 input:output mix (uncached input)."""
    return ((3 * Decimal(tier.price_input_per_m) + Decimal(tier.price_output_per_m)) / 4
            ).quantize(Decimal("0.00000001"))


def list_tiers() -> list[Tier]:
    return list(db.session.scalars(db.select(Tier).order_by(Tier.rank)))


def list_pools() -> list[Pool]:
    return list(db.session.scalars(db.select(Pool).order_by(Pool.name)))


def get_tier(tier_id: int) -> Tier:
    tier = db.session.get(Tier, tier_id)
    if tier is None:
        raise NotFound("no such tier")
    return tier


def get_pool(pool_id: int) -> Pool:
    pool = db.session.get(Pool, pool_id)
    if pool is None:
        raise NotFound("no such pool")
    return pool


def _price(errors: dict, field: str, raw: Any) -> Decimal | None:
    try:
        val = Decimal(str(raw).strip())
    except (InvalidOperation, ValueError):
        errors[field] = ["must be a number (USD per 1M tokens)"]
        return None
    if not val.is_finite() or val < 0 or val > 100000:
        errors[field] = ["must be between 0 and 100000"]
        return None
    return val


def _reader(data: dict, current: Any) -> Callable[..., Any]:
    """A field's value: as submitted, else the current row's, else the default given."""
    return lambda k, d=None: data.get(k, getattr(current, k) if current else d)


def _slug(errors: dict, clean: dict, get: Callable[..., Any], field: str,
          default: str = "") -> None:
    value = str(get(field, default) or "").strip()
    if not _NAME.match(value):
        errors[field] = ["use 1-64 lower-case letters, digits, '.', '_' or '-'"]
    clean[field] = value


def _clean_tier(data: dict, current: Tier | None) -> dict:
    errors: dict[str, list[str]] = {}
    clean: dict[str, Any] = {}
    get = _reader(data, current)
    _slug(errors, clean, get, "name")
    try:
        rank = int(get("rank", 0))
        if not 1 <= rank <= 100:
            raise ValueError
        clean["rank"] = rank
    except (TypeError, ValueError):
        errors["rank"] = ["must be a whole number from 1 to 100"]
    model = str(get("model", "") or "").strip()
    if not model:
        errors["model"] = ["is required"]
    clean["model"] = model
    for field in ("price_input_per_m", "price_cached_input_per_m", "price_output_per_m"):
        clean[field] = _price(errors, field, get(field, 0))
    kind = get("upstream_kind", "pool")
    if kind not in UPSTREAM_KINDS:
        errors["upstream_kind"] = [f"must be one of {', '.join(UPSTREAM_KINDS)}"]
    clean["upstream_kind"] = kind
    raw_pool = get("pool_id")
    pool_id = row_id(raw_pool) if raw_pool not in (None, "", 0, "0") else None
    if raw_pool not in (None, "", 0, "0") and pool_id is None:
        errors["pool_id"] = ["must be a pool id"]
    endpoint = str(get("endpoint_url", "") or "").strip()
    key_env = str(get("api_key_env", "") or "").strip()
    if kind == "pool":
        if pool_id is None or db.session.get(Pool, pool_id) is None:
            errors["pool_id"] = ["choose an existing pool for a pool upstream"]
        endpoint = ""
    elif kind == "external":
        if not re.match(r"^https?://[^\s/]+", endpoint):
            errors["endpoint_url"] = ["must be an http(s) URL of an OpenAI-compatible API"]
        pool_id = None
    if key_env.startswith("sk-"):
        errors["api_key_env"] = ["looks like a key: give the name of the variable that holds it"]
    elif key_env and not is_provider_key_name(key_env):
        errors["api_key_env"] = [f"must be a provider key name, {PROVIDER_KEY_PREFIX}<NAME> "
                                 "(upper case; the key itself stays out of the database)"]
    clean.update(pool_id=pool_id, endpoint_url=endpoint, api_key_env=key_env)
    try:
        timeout = float(get("timeout_s", 60.0))
        if not 0.1 <= timeout <= 3600:
            raise ValueError
        clean["timeout_s"] = timeout
    except (TypeError, ValueError):
        errors["timeout_s"] = ["must be between 0.1 and 3600 seconds"]
    enabled = get("enabled", True)
    clean["enabled"] = enabled if isinstance(enabled, bool) else str(enabled).lower() in {
        "1", "true", "on", "y", "yes"}
    if not errors:
        for field, col in (("name", Tier.name), ("rank", Tier.rank)):
            other = db.session.scalar(db.select(Tier).where(col == clean[field]))
            if other is not None and other is not current:
                raise Conflict(f"another tier has this {field}", {field: ["is already taken"]})
    if errors:
        raise ValidationError("invalid tier", errors)
    return clean


def save_tier(user, data: dict, tier_id: int | None = None) -> Tier:
    _require(user, "catalog.manage")
    tier = get_tier(tier_id) if tier_id else None
    clean = _clean_tier(data, tier)
    upstream_before = {f: getattr(tier, f) for f in UPSTREAM_FIELDS} if tier else None
    upstream_after = {f: clean[f] for f in UPSTREAM_FIELDS}
    external = "external" in (clean["upstream_kind"], (upstream_before or {}).get("upstream_kind"))
    if external and upstream_after != upstream_before and not user.can("secret.manage"):
        raise Forbidden("only an admin may point a tier at an external endpoint or change "
                        "its credential", {f: ["admin only"] for f in UPSTREAM_FIELDS
                                           if upstream_after[f] != (upstream_before or {}).get(f)})
    before = tier.to_dict() if tier else None
    if tier is None:
        tier = Tier(**clean)
        db.session.add(tier)
    else:
        for k, v in clean.items():
            setattr(tier, k, v)
    db.session.flush()
    record(user, "tier.update" if before else "tier.create", "tier", tier.id, before=before,
           after=tier.to_dict())
    if external and upstream_after != upstream_before:
        record(user, "tier.upstream_change", "tier", tier.id, before=upstream_before,
               after=upstream_after)
    db.session.commit()
    publish_after_commit()
    return tier


def _clean_pool(data: dict, current: Pool | None) -> dict:
    errors: dict[str, list[str]] = {}
    clean: dict[str, Any] = {}
    get = _reader(data, current)
    _slug(errors, clean, get, "name")
    _slug(errors, clean, get, "node", "local")
    engine = get("engine", "reference")
    if engine not in ENGINES:
        errors["engine"] = [f"must be one of {', '.join(ENGINES)}"]
    clean["engine"] = engine
    model = str(get("model", "") or "").strip()
    if not model:
        errors["model"] = ["is required"]
    clean["model"] = model
    clean["served_model_name"] = str(get("served_model_name", "") or "").strip()
    options = get("options", {}) or {}
    if isinstance(options, str):
        import json
        try:
            options = json.loads(options) if options.strip() else {}
        except ValueError:
            errors["options"] = ["must be a JSON object"]
            options = {}
    if not isinstance(options, dict):
        errors["options"] = ["must be a JSON object"]
        options = {}
    problems = validate_options(options, engine)
    if problems:
        errors["options"] = [f"{name}: {p}" for name, ps in sorted(problems.items()) for p in ps]
    clean["options"] = options
    for field, lo, hi, default in (("desired_replicas", 0, 64, 1), ("base_port", 1024, 65000, 8500),
                                   ("gpus_per_replica", 0, 64, 1)):
        try:
            val = int(get(field, default))
            if not lo <= val <= hi:
                raise ValueError
            clean[field] = val
        except (TypeError, ValueError):
            errors[field] = [f"must be a whole number from {lo} to {hi}"]
    clean["gpu_type"] = str(get("gpu_type", "") or "").strip()
    try:
        w = float(get("capacity_weight", 1.0))
        if not 0 < w <= 1000:
            raise ValueError
        clean["capacity_weight"] = w
    except (TypeError, ValueError):
        errors["capacity_weight"] = ["must be a positive number"]
    if not errors:
        other = db.session.scalar(db.select(Pool).where(Pool.name == clean["name"]))
        if other is not None and other is not current:
            raise Conflict("another pool has this name", {"name": ["is already taken"]})
        clash = _port_clash(clean, current)
        if clash:
            raise Conflict("a port of this pool is taken on its node", clash)
    if errors:
        raise ValidationError("invalid pool", errors)
    return clean


def _port_clash(clean: dict, current: Pool | None) -> dict[str, list[str]]:
    """Errors (on base_port, or on options when a KV-event or side-channel port clashes)
    when a port this pool's replicas would bind on its node is one another pool's bind
    there (``vllm_cmd.node_ports``): the second engine would fail to start, or two
    engines' KV events would mix on one socket."""
    from workers.pools.vllm_cmd import node_ports
    mine = node_ports(clean)
    others = db.session.scalars(db.select(Pool).where(Pool.node == clean["node"]))
    for other in others:
        if current is not None and other.id == current.id:
            continue
        theirs = node_ports(other.to_dict())
        shared = sorted(set(mine) & set(theirs))
        if shared:
            port = shared[0]
            field = "base_port" if mine[port].endswith("HTTP") else "options"
            return {field: [f"port {port} ({mine[port]}) is pool {other.name}'s "
                            f"{theirs[port]} on node {clean['node']}"
                            + (f", and {len(shared) - 1} more" if len(shared) > 1 else "")]}
    return {}


def save_pool(user, data: dict, pool_id: int | None = None) -> Pool:
    _require(user, "catalog.manage")
    pool = get_pool(pool_id) if pool_id else None
    clean = _clean_pool(data, pool)
    args_before = (pool.options or {}).get("extra_args") if pool else None
    args_after = clean["options"].get("extra_args")
    if args_after != args_before and not user.can("engine.configure"):
        raise Forbidden("only an admin may set an engine's extra arguments",
                        {"options": ["extra_args: admin only"]})
    before = pool.to_dict() if pool else None
    if pool is None:
        pool = Pool(**clean)
        db.session.add(pool)
    else:
        for k, v in clean.items():
            setattr(pool, k, v)
    db.session.flush()
    sync_replica_rows(pool)
    record(user, "pool.update" if before else "pool.create", "pool", pool.id, before=before,
           after=pool.to_dict())
    if args_after != args_before:
        record(user, "pool.extra_args_change", "pool", pool.id,
               before={"extra_args": args_before}, after={"extra_args": args_after})
    db.session.commit()
    publish_after_commit()
    return pool


def sync_replica_rows(pool: Pool) -> None:
    """Make one Replica row per desired replica (extra rows are marked stopped, not deleted,
    so their history and ids stay)."""
    existing = {r.index: r for r in pool.replicas}
    for i in range(pool.desired_replicas):
        if i not in existing:
            pool.replicas.append(Replica(index=i, url=f"http://127.0.0.1:{pool.base_port + i}",
                                         state="pending", weight=pool.capacity_weight))
    for i, r in existing.items():
        if i >= pool.desired_replicas and r.state not in ("stopped",):
            r.state = "stopped"
