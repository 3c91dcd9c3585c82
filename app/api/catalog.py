"""Admin API: tiers and pools."""
from __future__ import annotations

from flask import g, jsonify

from app.api.views import api_auth, body, bp
from app.catalog import service
from app.catalog.models import Tier


def _tier(tier: Tier) -> dict:
    return {**tier.to_dict(), "price_blended_per_m": str(service.blended_price(tier))}


@bp.get("/tiers")
@api_auth
def tiers_list():
    return jsonify(tiers=[_tier(t) for t in service.list_tiers()])


@bp.post("/tiers")
@api_auth
def tier_create():
    return jsonify(_tier(service.save_tier(g.api_user, body()))), 201


@bp.get("/tiers/<int:tier_id>")
@api_auth
def tier_get(tier_id: int):
    return jsonify(_tier(service.get_tier(tier_id)))


@bp.patch("/tiers/<int:tier_id>")
@api_auth
def tier_update(tier_id: int):
    data = body()
    service.get_tier(tier_id)  # 404 before validation
    return jsonify(_tier(service.save_tier(g.api_user, data, tier_id)))


@bp.get("/pools")
@api_auth
def pools_list():
    return jsonify(pools=[p.to_dict() for p in service.list_pools()])


@bp.post("/pools")
@api_auth
def pool_create():
    return jsonify(service.save_pool(g.api_user, body()).to_dict()), 201


@bp.get("/pools/<int:pool_id>")
@api_auth
def pool_get(pool_id: int):
    pool = service.get_pool(pool_id)
    return jsonify({**pool.to_dict(), "replicas": [r.to_dict() for r in pool.replicas]})


@bp.patch("/pools/<int:pool_id>")
@api_auth
def pool_update(pool_id: int):
    data = body()
    service.get_pool(pool_id)
    return jsonify(service.save_pool(g.api_user, data, pool_id).to_dict())
