"""Training, versioning, promotion and publishing of cascade-router models.

Scopes: "global", "tenant:<id>" or "tenant:<id>:wf:<workflow>". The active model of a
scope is published to Redis as JSON under ``<ns>:router:<scope>:active`` and
``<ns>:router:version`` is bumped, so a gateway polls one key and reloads on change.
τ stays in the tenant's policy (router_tau_1/2), which reaches the gateway through the
config snapshot; the console sets it from a model's held-out cost-quality curve.
"""
from __future__ import annotations

import json
import logging
from decimal import Decimal
from typing import Any, Mapping, Sequence

from flask import current_app

from app.audit.service import record
from app.core import router_model as rm
from app.core.router_features import EMBEDDING_DIM, feature_dim
from app.errors import Conflict, Forbidden, NotFound, ValidationError
from app.extensions import db
from app.models_base import utcnow
from app.cascade import evaluation as ev
from app.cascade.models import RouterModel
from app.cascade.training import fit_router

log = logging.getLogger(__name__)

N_TIERS = 3
# Allowed status changes (retired -> active is a rollback).
TRANSITIONS: dict[str, frozenset[str]] = {
    "candidate": frozenset({"active", "rejected"}),
    "active": frozenset({"retired"}),
    "retired": frozenset({"active"}),
    "rejected": frozenset(),
}
DEFAULT_PRICES = {1: (0.06, 0.06), 2: (0.35, 0.35), 3: (3.50, 3.50)}  # $/1M, the seed's



def scope_tenant_id(scope: str) -> int | None:
    """The tenant a scope belongs to (None for "global"); ValidationError if malformed."""
    parts = scope.split(":")
    if scope == "global":
        return None
    if len(parts) >= 2 and parts[0] == "tenant" and parts[1].isdigit() and (
            len(parts) == 2 or (len(parts) >= 4 and parts[2] == "wf")):
        return int(parts[1])
    raise ValidationError("bad router scope", {"scope": ["use global, tenant:<id> or "
                                                         "tenant:<id>:wf:<workflow>"]})


def tier_prices() -> dict[int, tuple[float, float]]:
    """(input, output) $/1M per tier rank from the catalog; the seed's prices where missing."""
    from app.catalog.models import Tier
    prices = dict(DEFAULT_PRICES)
    for t in db.session.scalars(db.select(Tier).where(Tier.rank <= N_TIERS)):
        prices[t.rank] = (float(Decimal(t.price_input_per_m)), float(Decimal(t.price_output_per_m)))
    return prices


def versions(scope: str) -> list[RouterModel]:
    return list(db.session.scalars(db.select(RouterModel).where(RouterModel.scope == scope)
                                   .order_by(RouterModel.version.desc())))


def active_model(scope: str) -> RouterModel | None:
    return db.session.scalar(db.select(RouterModel).where(RouterModel.scope == scope,
                                                          RouterModel.status == "active"))


def get_model(user, model_id: int) -> RouterModel:
    m = db.session.get(RouterModel, model_id)
    if m is None or (user is not None and not user.sees_tenant(scope_tenant_id(m.scope))):
        raise NotFound("router model not found")
    return m


def list_scopes(user) -> list[str]:
    scopes = db.session.scalars(db.select(RouterModel.scope).distinct().order_by(RouterModel.scope))
    return [s for s in scopes if user is None or user.sees_tenant(scope_tenant_id(s))]


def _transition(model: RouterModel, status: str) -> None:
    if status not in TRANSITIONS[model.status]:
        raise Conflict(f"a {model.status} router model cannot become {status}")
    model.status = status


def train_scope(scope: str, traces: Sequence[Mapping[str, Any]], *,
                prices: Mapping[int, tuple[float, float]] | None = None,
                quality_target: float | None = None) -> RouterModel | None:
    """Train a new version on ``traces``, compare it with the active one on held-out traces,
    and promote it (publishing to the gateway) only if it is not worse at equal cost.
    Returns None when there are not enough labels yet."""
    scope_tenant_id(scope)
    min_labels = int(current_app.config["ROUTER_MIN_LABELS"])
    target = float(quality_target if quality_target is not None
                   else current_app.config["ROUTER_QUALITY_TARGET"])
    prices = prices or tier_prices()
    train, test = ev.split(traces, float(current_app.config["ROUTER_HELDOUT_FRACTION"]))
    ranks = list(range(1, N_TIERS))
    sets = ev.training_sets(train, ranks, N_TIERS)
    if any(r not in sets or len(sets[r][1]) < min_labels for r in ranks):
        log.info("router %s: not enough labels (%s)", scope,
                 {r: len(sets[r][1]) if r in sets else 0 for r in ranks})
        return None
    dim = len(next(iter(sets.values()))[0][0])
    params = fit_router(sets, fallback_rank=N_TIERS,
                        raw_dims=EMBEDDING_DIM if dim == feature_dim() else 0)
    held_sets = ev.training_sets(test, ranks, N_TIERS)
    X, labels, costs = ev.evaluation_arrays(test, prices, N_TIERS)
    report = ev.curve_report(params, X, labels, costs, target)
    current = active_model(scope)
    current_report = None
    if current is not None and len(X):
        try:
            current_report = ev.curve_report(current.params, X, labels, costs, target)
        except (ValueError, KeyError) as exc:  # e.g. the feature layout changed
            log.warning("router %s v%s cannot be evaluated: %s", scope, current.version, exc)
    comparison = ev.compare(report, current_report)
    judged = min(ev.known_labels(labels).values()) if len(X) else 0
    if judged < int(current_app.config["ROUTER_MIN_HELDOUT"]):
        comparison = {**comparison, "promote": False, "reject": False,
                      "reason": f"only {judged} held-out labels for the least-known tier"}
    version = (db.session.scalar(db.select(db.func.max(RouterModel.version))
                                 .where(RouterModel.scope == scope)) or 0) + 1
    model = RouterModel(scope=scope, version=version, status="candidate",
                        trained_on=sum(len(y) for _, y in sets.values()), params=params,
                        metrics={"calibration": ev.calibration_report(params, held_sets),
                                 "held_out": report, "comparison": comparison,
                                 "trained_at": utcnow().isoformat()})
    db.session.add(model)
    db.session.flush()
    if comparison["promote"]:
        _activate(model, current)
    elif comparison.get("reject"):
        _transition(model, "rejected")
    record(None, "router.train", "router_model", model.id, tenant_id=scope_tenant_id(scope),
           after={"scope": scope, "version": version, "status": model.status,
                  "reason": comparison["reason"]})
    db.session.commit()
    if model.status == "active":
        publish_active(scope)
    return model


def _activate(model: RouterModel, current: RouterModel | None) -> None:
    if current is not None and current.id != model.id:
        _transition(current, "retired")
        db.session.flush()
    _transition(model, "active")


def activate(user, model_id: int) -> RouterModel:
    """Put a candidate or retired version into service by hand (a rollback, say)."""
    model = get_model(user, model_id)
    tenant_id = scope_tenant_id(model.scope)
    if not user.can("policy.manage", tenant_id):
        raise Forbidden(f"your role ({user.role}) may not change routers")
    before = model.status
    _activate(model, active_model(model.scope))
    record(user, "router.activate", "router_model", model.id, tenant_id=tenant_id,
           before={"status": before}, after={"status": "active", "version": model.version})
    db.session.commit()
    publish_active(model.scope)
    return model


def active_key(scope: str) -> str:
    from app.redis_client import keys
    return keys().router_active(scope)


def publish_active(scope: str) -> int | None:
    """Store the active params of ``scope`` in Redis (or delete the key when none) and bump
    ``<ns>:router:version``. A Redis outage is logged; the task retries later."""
    from app.redis_client import get_redis, keys
    model = active_model(scope)
    try:
        r = get_redis()
        if model is None:
            r.delete(active_key(scope))
        else:
            r.set(active_key(scope), json.dumps(
                {"scope": scope, "version": model.version, "model_id": model.id,
                 "params": model.params}, separators=(",", ":")))
        return int(r.incr(keys().routers_version()))
    except Exception as exc:  # noqa: BLE001 - the committed promotion stands
        log.warning("router publish for %s failed: %s", scope, exc)
        return None


def publish_all() -> int:
    scopes = db.session.scalars(db.select(RouterModel.scope).where(RouterModel.status == "active"))
    n = 0
    for s in scopes:
        n += publish_active(s) is not None
    return n


def taus_for_target(model: RouterModel, quality_target: float) -> dict[str, float] | None:
    """The policy τ values that reach ``quality_target`` on the model's held-out curve."""
    curve = (model.metrics or {}).get("held_out", {}).get("curve") or []
    point = rm.choose_taus(curve, quality_target)
    if point is None:
        return None
    return {"router_tau_1": float(point["taus"]["1"]), "router_tau_2": float(point["taus"]["2"])}


def set_taus_for_target(user, model_id: int, quality_target: float):
    """Write the τ for ``quality_target`` into the scope's tenant policy (or the global one)."""
    from app.policies.service import update_policy
    if not 0.5 <= quality_target <= 1.0:
        raise ValidationError("invalid quality target",
                              {"quality_target": ["must be between 0.5 and 1.0"]})
    model = get_model(user, model_id)
    taus = taus_for_target(model, quality_target)
    if taus is None:
        raise ValidationError("no operating point reaches that quality",
                              {"quality_target": [f"no held-out point reaches {quality_target:.1%}"
                                                  " of frontier quality"]})
    return update_policy(user, scope_tenant_id(model.scope), taus), taus
