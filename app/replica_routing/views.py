"""Routing console page: the prefix-routing simulator comparison and the template lint."""
from __future__ import annotations

from flask import Blueprint, flash, redirect, render_template, request, url_for
from flask_login import current_user, login_required

from app.console.helpers import require
from app.core.prefix_sim import DEFAULT_KV_TOKENS
from app.errors import ServiceError
from app.redis_client import get_redis, keys
from app.contract import lint
from app.replica_routing import charts, service

from app.console.assets import plotly_js_response  # noqa: E402

bp = Blueprint("replica_routing", __name__, url_prefix="/routing")


@bp.route("/plotly.js")
def plotly_js():
    return plotly_js_response()


@bp.route("/")
@login_required
def index():
    runs = service.latest_simulations()
    latest = runs[0] if runs else None
    chart = charts.comparison_html(latest.result) if latest and latest.result else ""
    try:
        lint_rows = lint.lint_report(get_redis(), keys(), tenant_id=current_user.tenant_id)
        lint_error = ""
    except Exception as exc:  # noqa: BLE001 - Redis down: the page still shows the simulator
        lint_rows, lint_error = [], f"live traffic samples unavailable ({exc.__class__.__name__})"
    try:
        kv = service.kv_routing_status()
    except Exception as exc:  # noqa: BLE001 - Redis down: the page still shows the rest
        kv = {"error": f"replica index unavailable ({exc.__class__.__name__})"}
    return render_template("replica_routing/index.html", runs=runs, latest=latest, chart=chart,
                           lint_rows=lint_rows, lint_error=lint_error, kv=kv,
                           can_run=current_user.can("drill.run"), default_kv=DEFAULT_KV_TOKENS)


@bp.route("/simulate", methods=["POST"])
@login_required
def simulate():
    require("drill.run")
    try:
        run = service.run_seed_simulation(
            replicas=int(request.form.get("replicas") or 8),
            kv_tokens=int(request.form.get("kv_tokens") or DEFAULT_KV_TOKENS),
            requests=int(request.form.get("requests") or 5000), actor=current_user)
    except ValueError:
        flash("replicas, KV tokens and requests must be whole numbers", "error")
        return redirect(url_for("replica_routing.index"))
    except ServiceError as exc:
        flash("; ".join(f"{k}: {', '.join(v)}" for k, v in exc.errors.items()) or exc.message,
              "error")
        return redirect(url_for("replica_routing.index"))
    flash(f"Simulation #{run.id} finished ({run.status})", "success")
    return redirect(url_for("replica_routing.index"))
