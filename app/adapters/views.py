"""Adapters: the rollout console (the list, one adapter's evidence and the buttons the state
table allows its viewer) and the matching admin API. Every change goes through
``app.adapters.rollout`` (approve, reject, canary steps, promote, rollback: they queue the
hot-(un)load), ``app.adapters.training`` (train, cancel) or ``service.transition``."""
from __future__ import annotations

import json

from flask import Blueprint, flash, g, jsonify, redirect, render_template, request, url_for
from flask_login import current_user, login_required

from app.adapters import rollout, service, states
from app.adapters.models import Adapter
from app.api.views import api_auth, body
from app.console.assets import plotly_js_response
from app.errors import NotFound, ServiceError, ValidationError
from app.extensions import db
from app.models_base import row_id

bp = Blueprint("adapters", __name__)
api_bp = Blueprint("adapters_api", __name__)

STATES = sorted({s for allowed, to, _ in states.TRANSITIONS.values() for s in (*allowed, to)})
ROLLOUT_EVENTS = ("approve", "reject", "advance", "promote", "rollback", "shadow", "retire")
TRANSITION_EVENTS = ("submit",)
LABELS = {"approve": "Approve", "reject": "Reject", "advance": "Next canary step",
          "promote": "Promote", "rollback": "Roll back", "cancel": "Cancel training",
          "shadow": "Start shadow", "submit": "Submit for approval", "retire": "Retire",
          "retrain": "Retrain on current traces"}
COMMENT_REQUIRED = frozenset({"approve", "reject"})


def perform(user, adapter_id: int, event: str, comment: str = "") -> Adapter:
    """A person's ``event`` on an adapter, through the function that owns its side effects;
    NotFound for an event no person sends (the system's own: trained, supersede ...).
    A refusal rolls the session back: rollout sets the canary share before the
    transition checks the permission, and a refused change must not ride a later commit."""
    try:
        return _dispatch(user, adapter_id, event, comment)
    except ServiceError:
        db.session.rollback()
        raise


def _dispatch(user, adapter_id: int, event: str, comment: str) -> Adapter:
    if event in ROLLOUT_EVENTS:
        return getattr(rollout, event)(user, adapter_id, comment)
    if event == "cancel":
        from app.adapters import training
        return training.cancel_training(user, adapter_id, comment)
    if event == "retrain":   # returns the new adapter, in training
        from app.adapters import training
        return training.retrain(user, adapter_id, comment)
    if event in TRANSITION_EVENTS:
        return service.transition(user, service.get_adapter(user, adapter_id), event, comment)
    raise NotFound(f"no adapter event {event!r}")


def train_workflow(user, tenant_id: int, workflow: str, *,
                   hyperparams: dict | None = None) -> Adapter:
    """Request the training of the tenant's workflow named or signed ``workflow`` (a
    refusal rolls back, releasing the tenant row request_training locked)."""
    from app.adapters import training
    training.require_train(user, tenant_id)   # before saying which workflows exist
    try:
        return training.request_training(user, tenant_id, workflow_signature(tenant_id, workflow),
                                          hyperparams=hyperparams)
    except ServiceError:
        db.session.rollback()
        raise


def workflow_signature(tenant_id: int, given: str) -> str:
    """The signature of the tenant's workflow whose signature or name (any case) is
    ``given``; a text that is neither is taken as a signature when the tenant has traces
    under it (a workflow the ledger has not drained yet), else a ValidationError."""
    from app.adapters.models import AdapterTrace
    from app.workflows.models import Workflow
    given = (given or "").strip()
    if not given:
        raise ValidationError("name the workflow", {"workflow": ["a signature or a name"]})
    rows = db.session.scalars(db.select(Workflow).where(
        Workflow.tenant_id == tenant_id,
        db.or_(Workflow.signature == given, db.func.lower(Workflow.name) == given.lower())))
    found = sorted(rows, key=lambda w: w.signature != given)
    if found:
        return found[0].signature
    if db.session.scalar(db.select(AdapterTrace.id).where(
            AdapterTrace.tenant_id == tenant_id, AdapterTrace.workflow == given).limit(1)):
        return given
    raise ValidationError(f"tenant {tenant_id} has no workflow {given!r} (neither a "
                          f"workflow's signature nor its name, and no traces under it)",
                          {"workflow": ["no workflow of this tenant has this name or "
                                        "signature"]})


def parse_state(raw: str | None) -> str | None:
    raw = (raw or "").strip()
    if raw and raw not in STATES:
        raise ValidationError("unknown state", {"state": [f"one of {', '.join(STATES)}"]})
    return raw or None


def parse_tenant_id(raw) -> int:
    value = row_id(raw)
    if value is None:
        raise ValidationError("which tenant?", {"tenant_id": ["a tenant id"]})
    return value


def _message(exc: ServiceError) -> str:
    fields = "; ".join(f"{k}: {', '.join(v)}" for k, v in exc.errors.items())
    return f"{exc.message} ({fields})" if fields else exc.message


def _tenant_names() -> dict[int, str]:
    from app.tenants.service import visible_tenants
    return {t.id: t.name for t in visible_tenants(current_user)}


def loss_figure(progress: dict) -> dict | None:
    """The training loss per step as a Plotly figure (data + layout), None before step 1."""
    import plotly.graph_objects as go
    history = [p for p in (progress or {}).get("history") or [] if len(p) == 2]
    if not history:
        return None
    fig = go.Figure(go.Scatter(x=[p[0] for p in history], y=[p[1] for p in history],
                               mode="lines", name="loss"))
    fig.update_layout(title="Training loss", xaxis_title="step", yaxis_title="loss", height=320,
                      margin=dict(l=50, r=20, t=40, b=40), template="plotly_white")
    return json.loads(fig.to_json())


# -- console -----------------------------------------------------------------------------
@bp.route("/adapters/plotly.js")
@login_required
def plotly_js():
    return plotly_js_response(public=False)


@bp.route("/adapters")
@login_required
def index():
    try:
        state = parse_state(request.args.get("state"))
    except ValidationError:
        state = None
    from app.workflows.service import list_workflows
    adapters = service.list_adapters(current_user,
                                     states_in=frozenset({state}) if state else None)
    tenants = _tenant_names()
    trainable = {tid: n for tid, n in tenants.items() if current_user.can("adapter.train", tid)}
    return render_template("adapters/index.html", adapters=adapters, tenants=tenants,
                           state=state, states=STATES, trainable=trainable,
                           workflows=list_workflows(current_user) if trainable else [])


@bp.route("/adapters/<int:adapter_id>")
@login_required
def detail(adapter_id: int):
    adapter = service.get_adapter(current_user, adapter_id)
    from app.adapters.traces import count_usable
    previous = db.session.get(Adapter, adapter.previous_adapter_id) \
        if adapter.previous_adapter_id else None
    request_event = next((e for e in adapter.events if e.event == "request"), None)
    retrain_of = (request_event.data or {}).get("retrain_of") if request_event else None
    from app.adapters.served_form import describe
    from app.policies.service import effective_policy
    form_text, form_differs = describe(adapter.form or {},
                                       effective_policy(adapter.tenant_id))
    return render_template("adapters/detail.html", adapter=adapter, previous=previous,
                           form_text=form_text, form_differs=form_differs,
                           retrain_of=db.session.get(Adapter, retrain_of) if retrain_of else None,
                           usable_now=count_usable(adapter.tenant_id, adapter.workflow),
                           tenant=_tenant_names().get(adapter.tenant_id, adapter.tenant_id),
                           timeline=service.timeline(adapter), labels=LABELS,
                           events=service.allowed_events(current_user, adapter),
                           comment_required=COMMENT_REQUIRED,
                           loss_figure=loss_figure(adapter.progress))


@bp.route("/adapters/<int:adapter_id>/<event>", methods=["POST"])
@login_required
def act(adapter_id: int, event: str):
    """One button of the detail page; a refusal is flashed (403 and 404 raised as such)."""
    try:
        adapter = perform(current_user, adapter_id, event, request.form.get("comment", ""))
    except ServiceError as exc:
        if exc.status in (403, 404):
            raise
        flash(_message(exc), "error")
    else:
        if event == "retrain":
            flash(f"Training of {adapter.name} queued on the workflow's current traces "
                  f"({adapter.progress.get('steps', '?')} steps); the adapter it replaces "
                  f"is retired.", "success")
            return redirect(url_for("adapters.detail", adapter_id=adapter.id))
        pct = f" at {adapter.canary_pct}%" if adapter.state == states.CANARY else ""
        flash(f"{adapter.name}: {LABELS.get(event, event).lower()} done; it is now "
              f"{adapter.state.replace('_', ' ')}{pct}.", "success")
    return redirect(url_for("adapters.detail", adapter_id=adapter_id))


@bp.route("/adapters/train", methods=["POST"])
@login_required
def train():
    try:
        adapter = train_workflow(current_user, parse_tenant_id(request.form.get("tenant_id")),
                                 request.form.get("workflow", ""))
    except ServiceError as exc:
        if exc.status == 403:
            raise
        flash(_message(exc), "error")
        return redirect(url_for("adapters.index"))
    flash(f"Training of {adapter.name} queued ({adapter.progress.get('steps', '?')} steps).",
          "success")
    return redirect(url_for("adapters.detail", adapter_id=adapter.id))


# -- admin API ---------------------------------------------------------------------------
def _full(adapter: Adapter) -> dict:
    return {**adapter.to_dict(), "updated_at": adapter.updated_at.isoformat()
            if adapter.updated_at else None, "timeline": service.timeline(adapter),
            "allowed_events": service.allowed_events(g.api_user, adapter)}


@api_bp.route("/adapters")
@api_auth
def api_list():
    state = parse_state(request.args.get("state"))
    raw_tenant = request.args.get("tenant_id")
    tenant_id = parse_tenant_id(raw_tenant) if raw_tenant not in (None, "") else None
    adapters = service.list_adapters(g.api_user, tenant_id=tenant_id,
                                     states_in=frozenset({state}) if state else None)
    return jsonify(adapters=[a.to_dict() for a in adapters])


@api_bp.route("/adapters/<int:adapter_id>")
@api_auth
def api_get(adapter_id: int):
    return jsonify(adapter=_full(service.get_adapter(g.api_user, adapter_id)))


@api_bp.route("/adapters", methods=["POST"])
@api_auth
def api_train():
    data = body()
    tenant_id = parse_tenant_id(data.get("tenant_id"))
    hyperparams = data.get("hyperparams")
    if hyperparams is not None and not isinstance(hyperparams, dict):
        raise ValidationError("bad hyperparameters", {"hyperparams": ["a JSON object"]})
    adapter = train_workflow(g.api_user, tenant_id, str(data.get("workflow") or ""),
                             hyperparams=hyperparams)
    return jsonify(adapter=_full(adapter)), 202


@api_bp.route("/adapters/<int:adapter_id>/<event>", methods=["POST"])
@api_auth
def api_act(adapter_id: int, event: str):
    data = body() if request.get_data() else {}  # a comment is optional but for approve/reject
    adapter = perform(g.api_user, adapter_id, event, str(data.get("comment") or ""))
    if event == "retrain":   # a new adapter, queued
        return jsonify(adapter=_full(adapter)), 202
    return jsonify(adapter=_full(adapter))
