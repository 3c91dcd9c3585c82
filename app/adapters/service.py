"""Adapter rollouts: reads scoped to what a user may see, and every state change through
``transition`` (the table in ``app.adapters.states``, the permission it names, the
four-eyes rule, an AdapterEvent on the timeline, an audit row, one commit, and a
snapshot publish when what the gateway serves changed). Console, API, CLI and the
workers all call these functions."""
from __future__ import annotations

from typing import Any

from app.adapters import states
from app.adapters.models import Adapter, AdapterEvent
from app.audit.service import SYSTEM, record  # noqa: F401 (SYSTEM: the workers' actor)
from app.errors import Forbidden, NotFound
from app.extensions import db
from app.snapshot.service import publish_after_commit


def visible(user, query=None):
    """Adapters ``user`` may see: all for global roles, its tenant's for scoped ones."""
    q = query if query is not None else db.select(Adapter)
    if user.tenant_id is not None:
        q = q.where(Adapter.tenant_id == user.tenant_id)
    return q


def list_adapters(user, *, tenant_id: int | None = None, workflow: str | None = None,
                  states_in: frozenset[str] | None = None) -> list[Adapter]:
    q = visible(user).order_by(Adapter.id.desc())
    if tenant_id is not None:
        q = q.where(Adapter.tenant_id == tenant_id)
    if workflow:
        q = q.where(Adapter.workflow == workflow)
    if states_in:
        q = q.where(Adapter.state.in_(states_in))
    return list(db.session.scalars(q))


def get_adapter(user, adapter_id: int) -> Adapter:
    """NotFound for an adapter that does not exist or that ``user`` may not see (no
    hint that another tenant's adapter exists)."""
    adapter = db.session.get(Adapter, adapter_id)
    if adapter is None or (user.tenant_id is not None and adapter.tenant_id != user.tenant_id):
        raise NotFound("no such adapter")
    return adapter


def allowed_events(user, adapter: Adapter) -> list[str]:
    """What ``user`` may do to ``adapter`` now (the console shows these buttons)."""
    out = []
    for event in states.events_from(adapter.state):
        if not user.can(states.permission(event), adapter.tenant_id):
            continue
        if event == "approve" and user.id is not None and user.id == adapter.requested_by_id:
            continue
        out.append(event)
    if adapter.state in states.RETRAINABLE and user.can("adapter.train", adapter.tenant_id):
        out.append("retrain")
    return out


def authorize(user, adapter: Adapter, event: str) -> str:
    """The state ``event`` would lead to, if the table and ``user`` allow it (Conflict /
    Forbidden otherwise). Callers that change the adapter around a transition check this
    first, so a refused request changes nothing."""
    to = states.target(event, adapter.state)
    perm = states.permission(event)
    if perm is not None and not user.can(perm, adapter.tenant_id):
        raise Forbidden(f"your role ({user.role}) may not {event} adapters")
    if event == "approve" and user.id is not None and user.id == adapter.requested_by_id:
        raise Forbidden("four eyes: the person who requested an adapter cannot approve it")
    return to


def transition(user, adapter: Adapter, event: str, comment: str = "", *,
               data: dict[str, Any] | None = None, commit: bool = True) -> Adapter:
    """Move ``adapter`` by ``event`` (raises Conflict / Forbidden, changing nothing)."""
    to = authorize(user, adapter, event)
    before = {"state": adapter.state, "canary_pct": adapter.canary_pct}
    served_before = adapter.state in states.SERVING
    db.session.add(AdapterEvent(adapter_id=adapter.id, actor_email=user.email, event=event,
                                from_state=adapter.state, to_state=to, comment=comment[:2000],
                                data=data or {}))
    adapter.state = to
    if event == "approve":
        adapter.approved_by = user.email
    after = {"state": to, "canary_pct": adapter.canary_pct, "comment": comment[:500]}
    record(user, f"adapter.{event}", "adapter", adapter.id, tenant_id=adapter.tenant_id,
           before=before, after=after)
    if commit:
        db.session.commit()
        if served_before or to in states.SERVING:
            publish_after_commit()
    return adapter


def timeline(adapter: Adapter) -> list[dict]:
    return [e.to_dict() for e in adapter.events]
