"""Console pages and admin API of the cascade router: versions, calibration, cost-quality, τ."""
from __future__ import annotations

from flask import (Blueprint, abort, flash, g, jsonify, redirect, render_template,
                   request, url_for)
from flask_login import current_user, login_required

from app.api.views import api_auth, body
from app.errors import ServiceError, ValidationError
from app.cascade import charts, gamma, service
from app.extensions import db

from app.console.assets import plotly_js_response  # noqa: E402

bp = Blueprint("cascade", __name__, url_prefix="/router")
api_bp = Blueprint("cascade_api", __name__)


@bp.route("/plotly.js")
def plotly_js():
    return plotly_js_response()


@bp.route("/")
@login_required
def index():
    rows = []
    for scope in service.list_scopes(current_user):
        vs = service.versions(scope)
        active = next((v for v in vs if v.status == "active"), None)
        rows.append({"scope": scope, "versions": len(vs), "active": active, "latest": vs[0]})
    return render_template("cascade/index.html", rows=rows)


@bp.route("/scope/<path:scope>")
@login_required
def scope_detail(scope: str):
    tenant_id = service.scope_tenant_id(scope)
    if not current_user.sees_tenant(tenant_id):
        abort(404)
    vs = service.versions(scope)
    if not vs:
        abort(404)
    chosen_id = request.args.get("model", type=int)
    model = next((v for v in vs if v.id == chosen_id), None) or \
        next((v for v in vs if v.status == "active"), vs[0])
    return render_template("cascade/scope.html", scope=scope, versions=vs, model=model,
                           calibration=(model.metrics or {}).get("calibration", {}),
                           held_out=(model.metrics or {}).get("held_out", {}),
                           comparison=(model.metrics or {}).get("comparison", {}),
                           reliability_html=charts.reliability_html(model),
                           curve_html=charts.curve_html(model),
                           can_manage=current_user.can("policy.manage", tenant_id))


def _require_manage(model_id: int) -> None:
    model = service.get_model(current_user, model_id)
    if not current_user.can("policy.manage", service.scope_tenant_id(model.scope)):
        abort(403)


@bp.route("/models/<int:model_id>/taus", methods=["POST"])
@login_required
def set_taus(model_id: int):
    _require_manage(model_id)
    model = service.get_model(current_user, model_id)
    try:
        target = float(request.form.get("quality_target", "")) / 100.0
    except ValueError:
        target = -1.0
    try:
        _, taus = service.set_taus_for_target(current_user, model_id, target)
    except ValidationError as exc:
        flash("; ".join(m for ms in exc.errors.values() for m in ms) or exc.message, "error")
    else:
        flash(f"τ set for {target:.1%} of frontier quality: tier 1 ≥ {taus['router_tau_1']:.2f}, "
              f"tier 2 ≥ {taus['router_tau_2']:.2f}", "info")
    return redirect(url_for("cascade.scope_detail", scope=model.scope, model=model_id))


@bp.route("/models/<int:model_id>/activate", methods=["POST"])
@login_required
def activate(model_id: int):
    _require_manage(model_id)
    try:
        model = service.activate(current_user, model_id)
    except ServiceError as exc:
        flash(exc.message, "error")
        model = service.get_model(current_user, model_id)
    else:
        flash(f"Version {model.version} is now active.", "info")
    return redirect(url_for("cascade.scope_detail", scope=model.scope, model=model_id))


# --- γ calibration (issue 24) ------------------------------------------------------------

def _gamma_form(args) -> dict:
    return {"tier": args.get("tier", ""), "kind": args.get("kind", "recall"),
            "target": args.get("target", "50"), "days": args.get("days", "30"),
            "model": args.get("model", "")}


def _gamma_fit(user, form: dict, save: bool = False) -> dict:
    try:
        target = float(form["target"]) / 100.0
        days = float(form["days"] or 30)
    except ValueError:
        raise ValidationError("the target and the window are numbers",
                              {"target": ["a percentage, e.g. 50"]}) from None
    return gamma.calibrate(user, form["tier"], form["kind"], target, days=days,
                           model=form["model"] or None, save=save)


@bp.route("/gamma", methods=["GET", "POST"])
@login_required
def gamma_page():
    """Fit S04's γ per tier for a target escalation recall or precision; show the curve;
    save it on the tier (POST)."""
    from app.catalog.models import Tier
    if not current_user.can("catalog.manage"):
        abort(403)
    source = request.form if request.method == "POST" else request.args
    form = _gamma_form(source)
    fit, status = None, 200
    if request.method == "POST" and source.get("clear"):
        tier = gamma.save_gamma(current_user, form["tier"], None)
        flash(f"γ cleared on {tier.name}: the policy's margin_gamma applies again.", "info")
        return redirect(url_for("cascade.gamma_page", tier=tier.id))
    if form["tier"]:
        try:
            fit = _gamma_fit(current_user, form, save=request.method == "POST")
        except ServiceError as exc:
            if exc.status == 403:
                raise
            flash("; ".join(m for ms in (exc.errors or {}).values() for m in ms) or exc.message,
                  "error")
            status = exc.status
        else:
            if fit["saved"]:
                flash(f"γ = {fit['gamma']:.4f} saved on {fit['tier']}; gateways use it from "
                      "the next snapshot.", "info")
                return redirect(url_for("cascade.gamma_page", **{**form, "tier": fit["tier_id"]}))
    tiers = list(db.session.scalars(db.select(Tier).order_by(Tier.rank)))
    return render_template("cascade/gamma.html", tiers=tiers, form=form, fit=fit,
                           curve_html=charts.gamma_curve_html(fit) if fit else ""), status


@api_bp.route("/router/gamma", methods=["POST"])
@api_auth
def api_gamma():
    """Fit (and with ``save``, store) a tier's γ; ``traces`` optional, else the ledger."""
    data = body()
    traces = data.get("traces")
    if traces is not None and not isinstance(traces, list):
        raise ValidationError("traces is a list", {"traces": ["a list of {margin, correct}"]})
    try:
        days = float(data.get("days", 30))
    except (TypeError, ValueError):
        raise ValidationError("days is a number", {"days": ["a number"]}) from None
    model = data.get("model")
    fit = gamma.calibrate(g.api_user, data.get("tier"), data.get("kind"), data.get("target"),
                          traces=traces, days=days,
                          model=model if isinstance(model, str) and model else None,
                          save=data.get("save") is True)
    return jsonify(fit)


def _model_json(m) -> dict:
    return {"id": m.id, "scope": m.scope, "version": m.version, "status": m.status,
            "created_at": m.created_at.isoformat(), "trained_on": m.trained_on,
            "metrics": {k: v for k, v in (m.metrics or {}).items() if k != "held_out"},
            "chosen": (m.metrics or {}).get("held_out", {}).get("chosen")}


@api_bp.route("/router/scopes")
@api_auth
def api_scopes():
    return jsonify(scopes=service.list_scopes(g.api_user))


@api_bp.route("/router/scopes/<path:scope>/models")
@api_auth
def api_versions(scope: str):
    if not g.api_user.sees_tenant(service.scope_tenant_id(scope)):
        return jsonify(models=[])
    return jsonify(models=[_model_json(m) for m in service.versions(scope)])


@api_bp.route("/router/models/<int:model_id>/taus", methods=["POST"])
@api_auth
def api_set_taus(model_id: int):
    data = body()
    try:
        target = float(data.get("quality_target"))
    except (TypeError, ValueError):
        raise ValidationError("invalid quality target",
                              {"quality_target": ["a fraction, e.g. 0.99"]}) from None
    _, taus = service.set_taus_for_target(g.api_user, model_id, target)
    return jsonify(taus=taus, quality_target=target)
