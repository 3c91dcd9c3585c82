"""Training, versioning, promotion and publishing of cascade-router models.

Scopes: "global", "tenant:<id>" or "tenant:<id>:wf:<workflow>". The active model of a
scope is published to Redis as JSON under ``<ns>:router:<scope>:active`` and
``<ns>:router:version`` is bumped, so a gateway polls one key and reloads on change.

τ belongs to a version: promotion sets it (``app.cascade.regret``: the cheapest held-out
point whose 95% upper bound on regret stays within the scope's policy
``router_max_regret`` and whose quality reaches the target) into ``metrics["taus"]``, and
it is published with the params, so each scope's router runs at its own τ. A version that
cannot meet the bound is not promoted, and ``metrics["comparison"]["reason"]`` says why;
the first version of a scope (no active one: its traffic runs on the tier-2 default) is
promoted "frontier only" instead (τ 1.0: every auto request goes to the frontier).
The policy's router_tau_1/2 apply to versions without τ (made before, or activated by
hand); the console's "set τ by quality target" writes both.
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
from app.cascade import regret
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


def scope_policy(scope: str) -> dict[str, Any]:
    """The effective policy a scope's router runs under (the global one for "global")."""
    from app.policies.service import effective_policy
    return effective_policy(scope_tenant_id(scope))


def _promotion(params: dict, X, labels, costs, target: float, max_regret: float, *,
               frontier_fallback: bool = False) -> dict[str, Any]:
    """τ for promotion (``app.cascade.regret.choose``), as stored in the version's metrics."""
    confidence = float(current_app.config["ROUTER_REGRET_CONFIDENCE"])
    found = regret.choose(params, X, labels, costs, quality_target=target,
                          max_regret=max_regret, confidence=confidence,
                          frontier_fallback=frontier_fallback)
    point, closest = found["point"], found["closest"]
    brief = (lambda p: None if p is None else {**ev._brief(p), "regret": p["regret"]})
    return {"max_regret": max_regret, "confidence": confidence, "quality_target": target,
            "taus": ({k: float(v) for k, v in point["taus"].items()} if point else None),
            "frontier_only": bool(point and point.get("frontier_only")),
            "point": brief(point), "closest": brief(closest), "reason": found["reason"]}


def train_scope(scope: str, traces: Sequence[Mapping[str, Any]], *,
                prices: Mapping[int, tuple[float, float]] | None = None,
                quality_target: float | None = None,
                max_regret: float | None = None) -> RouterModel | None:
    """Train a new version on ``traces``, compare it with the active one on held-out traces,
    and promote it (publishing to the gateway, with its τ) only if it is not worse at equal
    cost and some τ keeps the regret bound within ``max_regret`` (default: the scope's
    policy ``router_max_regret``). Returns None when there are not enough labels yet."""
    scope_tenant_id(scope)
    if max_regret is None:
        max_regret = float(scope_policy(scope)["router_max_regret"])
    min_labels = int(current_app.config["ROUTER_MIN_LABELS"])
    target = float(quality_target if quality_target is not None
                   else current_app.config["ROUTER_QUALITY_TARGET"])
    prices = prices or tier_prices()
    train, test = ev.split(traces, float(current_app.config["ROUTER_HELDOUT_FRACTION"]))
    ranks = list(range(1, N_TIERS))
    sets = ev.training_sets(train, ranks, N_TIERS)
    # A cheaper tier with too few labels is left out of the version (it never routes there)
    # rather than holding the others back: under frontier_until_router nothing serves tier
    # 2, so only frontier failures would ever label it, while exploration labels tier 1.
    learned = [r for r in ranks if r in sets and len(sets[r][1]) >= min_labels]
    if not learned:
        log.info("router %s: not enough labels (%s)", scope,
                 {r: len(sets[r][1]) if r in sets else 0 for r in ranks})
        return None
    sets = {r: sets[r] for r in learned}
    dim = len(next(iter(sets.values()))[0][0])
    params = fit_router(sets, fallback_rank=N_TIERS,
                        raw_dims=EMBEDDING_DIM if dim == feature_dim() else 0,
                        never=[r for r in ranks if r not in learned])
    held_sets = ev.training_sets(test, learned, N_TIERS)
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
    if current is not None and ((current.metrics or {}).get("promotion") or {}).get("frontier_only"):
        # The active version sends everything to the frontier: any version that meets the
        # bound below (checked next) is cheaper at frontier quality, whatever its curve's
        # point estimate at the quality target says.
        comparison = {"promote": bool(report.get("n")), "reject": False,
                      "reason": "replaces a frontier-only version" if report.get("n")
                      else "no labelled held-out traces"}
    known = ev.known_labels(labels) if len(X) else {}
    judged = min((known.get(str(r), 0) for r in (*learned, N_TIERS)), default=0) if len(X) else 0
    if judged < int(current_app.config["ROUTER_MIN_HELDOUT"]):
        comparison = {**comparison, "promote": False, "reject": False,
                      "reason": f"only {judged} held-out labels for the least-known tier"}
    # No active version: the scope's auto traffic runs on the tier-2 default, which a
    # version sending everything to the frontier beats when no τ below it is safe.
    promotion = _promotion(params, X, labels, costs, target, max_regret,
                           frontier_fallback=current is None)
    if comparison["promote"] and promotion["frontier_only"]:
        comparison = {**comparison, "reason": f"promoted, {promotion['reason']}"}
    if comparison["promote"] and promotion["taus"] is None:
        # not worse than the active version, but it cannot promise the bound: it stays a
        # candidate (a person may still activate it; it then runs at the policy's τ)
        comparison = {**comparison, "promote": False, "reject": False,
                      "reason": f"not promoted: {promotion['reason']}"}
    version = (db.session.scalar(db.select(db.func.max(RouterModel.version))
                                 .where(RouterModel.scope == scope)) or 0) + 1
    model = RouterModel(scope=scope, version=version, status="candidate",
                        trained_on=sum(len(y) for _, y in sets.values()), params=params,
                        metrics={"calibration": ev.calibration_report(params, held_sets),
                                 "held_out": report, "comparison": comparison,
                                 "promotion": promotion,
                                 "taus": promotion["taus"] if comparison["promote"] else None,
                                 "trained_at": utcnow().isoformat()})
    db.session.add(model)
    db.session.flush()
    if comparison["promote"]:
        _activate(model, current)
    elif comparison.get("reject"):
        _transition(model, "rejected")
    record(None, "router.train", "router_model", model.id, tenant_id=scope_tenant_id(scope),
           after={"scope": scope, "version": version, "status": model.status,
                  "reason": comparison["reason"], "taus": model.metrics["taus"],
                  "regret": promotion["reason"]})
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
                 "params": model.params, "taus": model_taus(model)}, separators=(",", ":")))
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


def model_taus(model: RouterModel) -> dict[str, float] | None:
    """The version's own τ ({"1": τ1, "2": τ2}), None when it has none (the gateway then
    uses the policy's)."""
    taus = (model.metrics or {}).get("taus")
    return {str(k): float(v) for k, v in taus.items()} if taus else None


def taus_for_target(model: RouterModel, quality_target: float) -> dict[str, float] | None:
    """The policy τ values that reach ``quality_target`` on the model's held-out curve."""
    curve = (model.metrics or {}).get("held_out", {}).get("curve") or []
    point = rm.choose_taus(curve, quality_target)
    if point is None:
        return None
    return {"router_tau_1": float(point["taus"]["1"]), "router_tau_2": float(point["taus"]["2"])}


def set_taus_for_target(user, model_id: int, quality_target: float):
    """Write the τ for ``quality_target`` into the version (republished when active: it
    beats the policy's for its scope) and the scope's tenant policy (or the global one),
    for versions without τ of their own. A person's choice: the regret bound is not
    checked here."""
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
    policy = update_policy(user, scope_tenant_id(model.scope), taus)
    model.metrics = {**(model.metrics or {}),
                     "taus": {"1": taus["router_tau_1"], "2": taus["router_tau_2"]}}
    record(user, "router.set_taus", "router_model", model.id,
           tenant_id=scope_tenant_id(model.scope),
           after={"version": model.version, "quality_target": quality_target, **taus})
    db.session.commit()
    if model.status == "active":
        publish_active(model.scope)
    return policy, taus
