"""Tiers (prices, upstream) and pools (engine options, desired replicas) of the catalog:
console pages (``bp``) and the admin API under ``/api/v1`` (``api_bp``)."""
from __future__ import annotations

import json

from flask import Blueprint, flash, g, jsonify, redirect, render_template, request, url_for
from flask_login import current_user, login_required

from app.api.views import api_auth, body
from app.catalog import service
from app.catalog.models import ENGINES, UPSTREAM_KINDS, Tier
from app.console.helpers import checkbox, form_data, render_errors, require
from app.errors import ServiceError

bp = Blueprint("catalog", __name__)
api_bp = Blueprint("catalog_api", __name__)

TIER_FIELDS = ("name", "rank", "model", "price_input_per_m", "price_cached_input_per_m",
               "price_output_per_m", "upstream_kind", "pool_id", "endpoint_url", "api_key_env",
               "timeout_s")
POOL_FIELDS = ("name", "node", "engine", "model", "served_model_name", "options",
               "desired_replicas", "base_port", "gpu_type", "gpus_per_replica",
               "capacity_weight")


@bp.route("/catalog/tiers")
@login_required
def tiers():
    return render_template("console/tiers.html", tiers=service.list_tiers(),
                           blended=service.blended_price,
                           can_manage=current_user.can("catalog.manage"))


def _tier_form(tier_id: int | None):
    require("catalog.manage")
    tier = service.get_tier(tier_id) if tier_id else None
    if tier is not None:
        values = {f: getattr(tier, f) for f in TIER_FIELDS} | {"enabled": tier.enabled}
    else:
        values = {"rank": "", "upstream_kind": "pool", "timeout_s": 60, "enabled": True,
                  "price_input_per_m": "0", "price_cached_input_per_m": "0",
                  "price_output_per_m": "0"}
    context = {"tier": tier, "pools": service.list_pools(), "kinds": UPSTREAM_KINDS}
    if request.method == "POST":
        values = form_data(*TIER_FIELDS) | {"enabled": checkbox("enabled")}
        try:
            tier = service.save_tier(current_user, values, tier_id)
        except ServiceError as exc:
            if not exc.errors:
                raise
            return render_errors("console/tier_form.html", exc, values=values, **context)
        flash(f"Tier {tier.name} saved.", "success")
        return redirect(url_for("catalog.tiers"))
    return render_template("console/tier_form.html", values=values, errors={}, **context)


@bp.route("/catalog/tiers/new", methods=["GET", "POST"])
@login_required
def tier_new():
    return _tier_form(None)


@bp.route("/catalog/tiers/<int:tier_id>/edit", methods=["GET", "POST"])
@login_required
def tier_edit(tier_id: int):
    return _tier_form(tier_id)


@bp.route("/catalog/pools")
@login_required
def pools():
    return render_template("console/pools.html", pools=service.list_pools(),
                           can_manage=current_user.can("catalog.manage"),
                           infra=current_user.tenant_id is None)


def _pool_form(pool_id: int | None):
    require("catalog.manage")
    pool = service.get_pool(pool_id) if pool_id else None
    if pool is not None:
        values = {f: getattr(pool, f) for f in POOL_FIELDS}
        values["options"] = json.dumps(pool.options or {}, indent=2, sort_keys=True)
    else:
        values = {"node": "local", "engine": "reference", "options": "{}",
                  "desired_replicas": 1, "base_port": 8500, "gpus_per_replica": 1,
                  "capacity_weight": 1.0}
    context = {"pool": pool, "engines": ENGINES}
    if request.method == "POST":
        values = form_data(*POOL_FIELDS)
        try:
            pool = service.save_pool(current_user, values, pool_id)
        except ServiceError as exc:
            if not exc.errors:
                raise
            return render_errors("console/pool_form.html", exc, values=values, **context)
        flash(f"Pool {pool.name} saved.", "success")
        return redirect(url_for("catalog.pools"))
    return render_template("console/pool_form.html", values=values, errors={}, **context)


@bp.route("/catalog/pools/new", methods=["GET", "POST"])
@login_required
def pool_new():
    return _pool_form(None)


@bp.route("/catalog/pools/<int:pool_id>/edit", methods=["GET", "POST"])
@login_required
def pool_edit(pool_id: int):
    return _pool_form(pool_id)


# ------------------------------------------------------------------ admin API (/api/v1)

def _tier(tier: Tier) -> dict:
    return {**tier.to_dict(), "price_blended_per_m": str(service.blended_price(tier))}


@api_bp.get("/tiers")
@api_auth
def api_tiers_list():
    return jsonify(tiers=[_tier(t) for t in service.list_tiers()])


@api_bp.post("/tiers")
@api_auth
def api_tier_create():
    return jsonify(_tier(service.save_tier(g.api_user, body()))), 201


@api_bp.get("/tiers/<int:tier_id>")
@api_auth
def api_tier_get(tier_id: int):
    return jsonify(_tier(service.get_tier(tier_id)))


@api_bp.patch("/tiers/<int:tier_id>")
@api_auth
def api_tier_update(tier_id: int):
    data = body()
    service.get_tier(tier_id)  # 404 before validation
    return jsonify(_tier(service.save_tier(g.api_user, data, tier_id)))


@api_bp.get("/pools")
@api_auth
def api_pools_list():
    return jsonify(pools=[_pool(p) for p in service.list_pools()])


def _pool(pool, replicas: bool = False) -> dict:
    """A pool as the API shows it: engine options, node and replica URLs are shared
    infrastructure, left out for tenant-scoped users."""
    out = pool.to_dict()
    if replicas:
        out["replicas"] = [r.to_dict() for r in pool.replicas]
    if g.api_user.tenant_id is not None:
        out.pop("options", None)
        out.pop("node", None)
        for r in out.get("replicas", ()):
            for k in ("url", "pid", "last_error"):
                r.pop(k, None)
    return out


@api_bp.post("/pools")
@api_auth
def api_pool_create():
    return jsonify(service.save_pool(g.api_user, body()).to_dict()), 201


@api_bp.get("/pools/<int:pool_id>")
@api_auth
def api_pool_get(pool_id: int):
    return jsonify(_pool(service.get_pool(pool_id), replicas=True))


@api_bp.patch("/pools/<int:pool_id>")
@api_auth
def api_pool_update(pool_id: int):
    data = body()
    service.get_pool(pool_id)
    return jsonify(service.save_pool(g.api_user, data, pool_id).to_dict())
