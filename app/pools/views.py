"""Pools page (live state, charts, operator buttons) and the matching admin API."""
from __future__ import annotations

import json
from typing import Any, Callable

from flask import Blueprint, flash, g, jsonify, redirect, render_template, request, url_for
from flask_login import current_user, login_required

from app.api.views import api_auth, body
from app.catalog.service import list_pools
from app.errors import Forbidden, ServiceError
from app.pools import service

from app.console.assets import plotly_js_response  # noqa: E402

bp = Blueprint("pools", __name__)
api_bp = Blueprint("pools_api", __name__)


def _global_only() -> None:
    if current_user.tenant_id is not None:
        raise Forbidden("pools are shared infrastructure")


@bp.route("/pools/plotly.js")
@login_required
def plotly_js():
    return plotly_js_response(public=False)


def _page_data() -> dict:
    pools = list_pools()
    ids = [r.id for p in pools for r in p.replicas]
    from app.adapters.serving import by_replica
    return {"pools": pools, "live": service.live_stats(ids),
            "series": service.metric_series(ids), "lora_last": _lora_last(pools),
            "adapters": by_replica([p.id for p in pools])}


def _lora_last(pools) -> dict[int, dict]:
    from app.redis_client import get_redis, keys
    out = {}
    try:
        for p in pools:
            raw = get_redis().get(keys().pool_lora_last(p.id))
            if raw:
                out[p.id] = json.loads(raw)
    except Exception:  # noqa: BLE001 - page renders without it
        pass
    return out


@bp.route("/pools")
@login_required
def index():
    _global_only()
    return render_template("pools/index.html", can_operate=current_user.can("pool.operate"),
                           **_page_data())


def _queue(request_it: Callable[[], Any], message: Callable[[Any], str]):
    """Ask the service to queue pool work, then back to the pools page with what was
    queued, or why not (a 403 is raised as one)."""
    try:
        done = request_it()
    except ServiceError as exc:
        if exc.status == 403:
            raise
        flash(exc.message, "error")
    else:
        flash(message(done), "success")
    return redirect(url_for("pools.index"))


@bp.route("/pools/<int:pool_id>/action", methods=["POST"])
@login_required
def pool_action(pool_id: int):
    action = request.form.get("action", "")
    return _queue(lambda: service.request_pool_action(current_user, pool_id, action),
                  lambda chosen: f"{action} queued for {len(chosen)} replica(s)")


@bp.route("/pools/replicas/<int:replica_id>/action", methods=["POST"])
@login_required
def replica_action(replica_id: int):
    action = request.form.get("action", "")
    return _queue(lambda: service.request_replica_action(current_user, replica_id, action),
                  lambda replica: f"{action} queued for {replica.name}")


@bp.route("/pools/<int:pool_id>/lora", methods=["POST"])
@login_required
def pool_lora(pool_id: int):
    action = "unload" if request.form.get("action") == "unload" else "load"
    name = request.form.get("lora_name", "")
    path = request.form.get("lora_path", "")
    return _queue(lambda: service.request_lora(current_user, pool_id, action, name, path),
                  lambda _: f"adapter {name}: {action} queued on every replica")


# -- admin API -------------------------------------------------------------------------------
@api_bp.route("/pools/status")
@api_auth
def api_status():
    if g.api_user.tenant_id is not None:
        raise Forbidden("pools are shared infrastructure")
    data = _page_data()
    return jsonify(pools=[{**p.to_dict(), "replicas": [
        {**r.to_dict(), "live": data["live"].get(r.id, {})} for r in p.replicas]}
        for p in data["pools"]])


@api_bp.route("/pools/<int:pool_id>/actions", methods=["POST"])
@api_auth
def api_pool_action(pool_id: int):
    chosen = service.request_pool_action(g.api_user, pool_id, str(body().get("action", "")))
    return jsonify(queued=[r.id for r in chosen]), 202


@api_bp.route("/pools/replicas/<int:replica_id>/actions", methods=["POST"])
@api_auth
def api_replica_action(replica_id: int):
    replica = service.request_replica_action(g.api_user, replica_id,
                                             str(body().get("action", "")))
    return jsonify(queued=[replica.id]), 202


@api_bp.route("/pools/<int:pool_id>/lora", methods=["POST"])
@api_auth
def api_pool_lora(pool_id: int):
    data = body()
    action = "unload" if data.get("action") == "unload" else "load"
    service.request_lora(g.api_user, pool_id, action, str(data.get("lora_name", "")),
                         str(data.get("lora_path", "")))
    return jsonify(queued=action), 202
