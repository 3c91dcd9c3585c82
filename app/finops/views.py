"""Console pages (``bp``) and admin API routes (``api_bp``, under /api/v1) of FinOps.
Thin: parse, call reports/service, render."""
from __future__ import annotations

import csv
import hashlib
import io
import json
from typing import Any, Iterable

from flask import (Blueprint, Response, flash, g, jsonify, redirect, render_template, request,
                   stream_with_context, url_for)
from flask_login import current_user, login_required

from app.api.views import api_auth, body
from app.core.costing import format_usd
from app.errors import Forbidden, ServiceError
from app.finops import charts, prices, reports, rollups, savings, service
from app.finops.models import AdjustmentRequest

bp = Blueprint("finops", __name__, url_prefix="/finops")
api_bp = Blueprint("finops_api", __name__)  # registered under /api/v1
_PLOTLY: dict[str, Any] = {}


@bp.app_template_filter("finops_usd")
def finops_usd(value) -> str:
    """An amount as every FinOps page shows it (``costing.format_usd``)."""
    return format_usd(value)


@bp.app_template_global("figures_as_of")
def _figures_as_of():
    """When the rollups last ran (the FinOps pages' "data as of")."""
    return service.figures_as_of()


@bp.app_template_filter("finops_pct")
def finops_pct(value, digits: int = 1) -> str:
    return "—" if value is None else f"{value:.{digits}f}%"


def _period():
    args = request.args
    return reports.parse_period(args.get("period"), args.get("start"), args.get("end"))


def _filters() -> dict[str, Any]:
    return {"period": request.args.get("period", ""), "start": request.args.get("start", ""),
            "end": request.args.get("end", ""), "tenant": request.args.get("tenant", "")}


# --- console --------------------------------------------------------------------------

@bp.route("/plotly.js")
def plotly_js():
    """plotly.js from the installed plotly package (no CDN); cached by browsers."""
    if not _PLOTLY:
        from plotly.offline import get_plotlyjs
        text = get_plotlyjs()
        _PLOTLY.update(text=text, etag=hashlib.sha256(text.encode()).hexdigest()[:32])
    if request.if_none_match.contains(_PLOTLY["etag"]):
        return Response(status=304, headers={"ETag": f'"{_PLOTLY["etag"]}"'})
    resp = Response(_PLOTLY["text"], mimetype="application/javascript")
    resp.headers["Cache-Control"] = "public, max-age=31536000, immutable"
    resp.set_etag(_PLOTLY["etag"])
    return resp


@bp.route("")
@login_required
def dashboard():
    period = _period()
    data = reports.dashboard(current_user, period, request.args.get("tenant"))
    return render_template("finops/dashboard.html", d=data, filters=_filters(),
                           figures=json.dumps(charts.dashboard_figures(data)),
                           tenants=reports.visible_tenants(current_user),
                           alerts=service.list_alerts(current_user, limit=5))


@bp.route("/cohorts")
@login_required
def cohorts():
    data = savings.add_quality(reports.cohorts(current_user, _period(),
                                               request.args.get("tenant")))
    return render_template("finops/cohorts.html", d=data, filters=_filters(),
                           figure=json.dumps(charts.cohort_figure(data)),
                           tenants=reports.visible_tenants(current_user))


@bp.route("/savings")
@login_required
def savings_page():
    """Where the money went: savings per stage, and the twelve months to the period's."""
    period = _period()
    tenant = request.args.get("tenant")
    stages = savings.stages(current_user, period, tenant)
    year = savings.twelve_months(current_user, period, tenant)
    return render_template("finops/savings.html", d=stages, year=year, filters=_filters(),
                           figures=json.dumps({"stages": charts.stage_figure(stages),
                                               "months": charts.months_figure(year)}),
                           tenants=reports.visible_tenants(current_user))


@bp.route("/showback")
@login_required
def showback():
    data = reports.showback(current_user, _period(), request.args.get("tenant"))
    tenants = reports.visible_tenants(current_user)
    return render_template("finops/showback.html", d=data, filters=_filters(), tenants=tenants,
                           pending=service.pending_adjustments(current_user),
                           tenant_names={t.id: t.name for t in tenants},
                           second_person_usd=service.second_person_threshold())


@bp.route("/budgets", methods=["GET", "POST"])
@login_required
def budgets():
    errors, values, status = {}, {}, 200
    if request.method == "POST":
        values = {k: request.form.get(k, "") for k in
                  ("tenant_id", "monthly_limit_usd", "action", "webhook_url")}
        try:
            service.save_budget(current_user, **values)
            flash("Budget saved; the gateway enforces it from now on.", "info")
            return redirect(url_for("finops.budgets"))
        except ServiceError as exc:
            if isinstance(exc, Forbidden):
                raise
            errors, status = exc.errors, exc.status
            flash(exc.message, "error")
    manageable = [t for t in reports.visible_tenants(current_user)
                  if current_user.can("budget.manage", t.id)]
    budgets = service.list_budgets(current_user)
    editing = None
    if request.method == "GET" and request.args.get("edit"):
        editing = next((b for b in budgets if str(b["tenant_id"]) == request.args["edit"]
                        and b["can_manage"]), None)
        if editing is not None:   # the form, filled with the budget as it is
            values = {"tenant_id": str(editing["tenant_id"]),
                      "monthly_limit_usd": str(editing["monthly_limit_usd"]),
                      "action": editing["action"], "webhook_url": editing["webhook_url"] or ""}
    return render_template("finops/budgets.html", budgets=budgets,
                           alerts=service.list_alerts(current_user), tenants=manageable,
                           editing=editing, errors=errors, values=values), status


@bp.route("/budgets/<int:tenant_id>/delete", methods=["POST"])
@login_required
def budget_delete(tenant_id: int):
    service.delete_budget(current_user, tenant_id)
    flash("Budget removed.", "info")
    return redirect(url_for("finops.budgets"))


@bp.route("/prices", methods=["GET", "POST"])
@login_required
def price_book():
    """Tier price changes and GPU hourly rates, in force now and scheduled."""
    errors, values, status = {}, {}, 200
    if request.method == "POST":
        kind = request.form.get("kind", "")
        values = {k: request.form.get(k, "") for k in request.form if k != "csrf_token"}
        try:
            if kind == "tier":
                prices.add_tier_price(current_user, request.form.get("tier_id"), values)
                flash("Price change scheduled; gateways book it from its date on.", "info")
            else:
                prices.add_gpu_rate(current_user, values)
                flash("GPU rate scheduled; pool hours are priced with it from its date on.",
                      "info")
            return redirect(url_for("finops.price_book"))
        except ServiceError as exc:
            if isinstance(exc, Forbidden):
                raise
            errors, status = exc.errors, exc.status
            flash(exc.message, "error")
    return render_template("finops/prices.html", book=prices.price_book(), errors=errors,
                           values=values, can_manage=current_user.can("budget.manage")), status


@bp.route("/adjustments", methods=["POST"])
@login_required
def adjustment():
    done = service.record_adjustment(current_user, request.form.get("tenant_id"),
                                     request.form.get("amount"), request.form.get("reason", ""))
    if isinstance(done, AdjustmentRequest):
        flash(f"Adjustments above {format_usd(service.second_person_threshold())} need a "
              "second person: it waits for another FinOps user's approval (below).", "info")
    else:
        flash("Adjustment recorded as a new ledger row.", "info")
    return redirect(url_for("finops.showback"))


@bp.route("/adjustments/requests/<int:request_id>/<any(approve, reject):decision>",
          methods=["POST"])
@login_required
def adjustment_decision(request_id: int, decision: str):
    req = service.decide_adjustment(current_user, request_id, decision == "approve",
                                    request.form.get("comment", ""))
    flash(f"Adjustment of {format_usd(req.amount_usd)} {req.state}"
          f"{' and booked' if req.state == 'approved' else ''}.", "info")
    return redirect(url_for("finops.showback"))


@bp.route("/rollups/rebuild", methods=["POST"])
@login_required
def rollups_rebuild():
    period = reports.parse_period(request.form.get("period"))
    diffs = _rebuild(current_user, period)
    flash(f"Rollups for {period.label} rebuilt from the ledger; "
          f"{len(diffs)} differences against the ledger.", "info" if not diffs else "error")
    return redirect(url_for("finops.showback", period=request.form.get("period", "")))


def _rebuild(user, period) -> list[dict]:
    if not user.can("budget.manage"):
        raise Forbidden("only global FinOps admins rebuild rollups")
    rollups.rebuild(period.start, period.end)
    return rollups.reconcile((period.start, period.end))


@bp.route("/export/<report>.csv")
@login_required
def export(report: str):
    return _csv_response(current_user, report)


# --- CSV ------------------------------------------------------------------------------

def _csv_lines(header: list[str], rows: Iterable[list[Any]]):
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(header)
    for i, row in enumerate(rows, 1):
        writer.writerow(row)
        if i % 500 == 0:
            yield buf.getvalue()
            buf.seek(0)
            buf.truncate()
    yield buf.getvalue()


def _csv_response(user, report: str) -> Response:
    """A streamed CSV; the tenant scope is checked before the response starts."""
    period = _period()
    tenant = request.args.get("tenant")
    if report == "ledger":
        header, rows = list(reports.LEDGER_COLUMNS), reports.ledger_rows(user, period, tenant)
    else:
        header, rows = reports.report_rows(user, report, period, tenant)
    name = f"sluice-{report}-{period.start:%Y%m%d}-{period.end:%Y%m%d}.csv"
    return Response(stream_with_context(_csv_lines(header, rows)), mimetype="text/csv",
                    headers={"Content-Disposition": f'attachment; filename="{name}"'})


# --- JSON API -------------------------------------------------------------------------

def _json(value: Any) -> Any:
    """Periods and datetimes as JSON; Decimals are left to the app's JSON provider
    (``app.factory.JSONProvider``: fixed point)."""
    if isinstance(value, dict):
        return {k: _json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json(v) for v in value]
    if isinstance(value, reports.Period):
        return {"start": value.start.isoformat(), "end": value.end.isoformat(),
                "label": value.label}
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return value


@api_bp.route("/finops/dashboard")
@api_auth
def api_dashboard():
    return jsonify(_json(reports.dashboard(g.api_user, _period(), request.args.get("tenant"))))


@api_bp.route("/finops/cohorts")
@api_auth
def api_cohorts():
    return jsonify(_json(savings.add_quality(
        reports.cohorts(g.api_user, _period(), request.args.get("tenant")))))


@api_bp.route("/finops/savings")
@api_auth
def api_savings():
    return jsonify(_json(savings.stages(g.api_user, _period(), request.args.get("tenant"))))


@api_bp.route("/finops/months")
@api_auth
def api_months():
    return jsonify(_json(savings.twelve_months(g.api_user, _period(),
                                               request.args.get("tenant"))))


@api_bp.route("/finops/showback")
@api_auth
def api_showback():
    return jsonify(_json(reports.showback(g.api_user, _period(), request.args.get("tenant"))))


@api_bp.route("/finops/export/<report>.csv")
@api_auth
def api_export(report: str):
    return _csv_response(g.api_user, report)


@api_bp.route("/finops/budgets")
@api_auth
def api_budgets():
    return jsonify(_json({"budgets": service.list_budgets(g.api_user),
                          "alerts": service.list_alerts(g.api_user)}))


@api_bp.route("/finops/budgets/<int:tenant_id>", methods=["PUT", "POST"])
@api_auth
def api_budget_save(tenant_id: int):
    data = body()
    row = service.save_budget(g.api_user, tenant_id, data.get("monthly_limit_usd"),
                              data.get("action", "alert"), data.get("webhook_url", ""))
    return jsonify(service.budget_dict(row))


@api_bp.route("/finops/budgets/<int:tenant_id>", methods=["DELETE"])
@api_auth
def api_budget_delete(tenant_id: int):
    service.delete_budget(g.api_user, tenant_id)
    return "", 204


@api_bp.route("/finops/adjustments", methods=["POST"])
@api_auth
def api_adjustment():
    data = body()
    row = service.record_adjustment(g.api_user, data.get("tenant_id"), data.get("amount"),
                                    data.get("reason", ""))
    if isinstance(row, AdjustmentRequest):   # two-person rule: accepted, not booked yet
        return jsonify({"pending": row.to_dict()}), 202
    return jsonify({"request_id": row.request_id, "tenant_id": row.tenant_id,
                    "amount_usd": row.cost_usd, "at": row.at.isoformat()}), 201


@api_bp.get("/finops/adjustments/requests")
@api_auth
def api_adjustment_requests():
    return jsonify({"pending": [r.to_dict() for r in service.pending_adjustments(g.api_user)]})


@api_bp.route("/finops/adjustments/requests/<int:request_id>/<any(approve, reject):decision>",
              methods=["POST"])
@api_auth
def api_adjustment_decision(request_id: int, decision: str):
    req = service.decide_adjustment(g.api_user, request_id, decision == "approve",
                                    str(body().get("comment") or ""))
    return jsonify(req.to_dict())


@api_bp.route("/finops/rollups/rebuild", methods=["POST"])
@api_auth
def api_rebuild():
    data = body() if request.get_data() else {}
    period = reports.parse_period(data.get("period"), data.get("start"), data.get("end"))
    return jsonify(_json({"period": period, "differences": _rebuild(g.api_user, period)}))


@api_bp.route("/finops/prices")
@api_auth
def api_prices():
    return jsonify(_json(prices.price_book()))


@api_bp.route("/finops/tiers/<int:tier_id>/prices", methods=["POST"])
@api_auth
def api_tier_price_add(tier_id: int):
    row = prices.add_tier_price(g.api_user, tier_id, body())
    return jsonify(_json({"id": row.id, "tier_id": row.tier_id,
                          "effective_from": row.effective_from,
                          "price_input_per_m": row.price_input_per_m,
                          "price_cached_input_per_m": row.price_cached_input_per_m,
                          "price_output_per_m": row.price_output_per_m})), 201


@api_bp.route("/finops/gpu-rates", methods=["POST"])
@api_auth
def api_gpu_rate_add():
    row = prices.add_gpu_rate(g.api_user, body())
    return jsonify(_json({"id": row.id, "gpu_type": row.gpu_type, "hourly_usd": row.hourly_usd,
                          "effective_from": row.effective_from})), 201
