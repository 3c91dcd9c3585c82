"""Router training traces read from the ledger (the gateway logs them in the payload).

What the gateway writes into ``LedgerEntry.payload`` for a request to be a trace:
``router_features`` (the S01 vector), ``tier_rank`` (the tier served),
``escalated_from`` ([ranks the margin monitor aborted]) and, from S05,
``pipeline.schema_valid``; the ledger drain adds ``feedback`` (``{"pass": bool, "note",
"at"}`` from POST /v1/feedback).

``shadow`` ({rank: bool}) comes from the gateway's tier-1 exploration runs
(``app.gateway.shadow``, explore mode): rows of kind ``shadow`` whose payload has
``explore: true``, ``shadow_of`` (the request they answered again), ``tier_rank`` and
``agreed``. The ledger is append-only, so the verdict stays in its own row and is joined
to its request here.
"""
from __future__ import annotations

from typing import Any

from app.extensions import db
from app.ledger.models import LedgerEntry
from app.cascade.service import scope_tenant_id

TRACE_FIELDS = ("feedback", "shadow", "escalated_from")


def schema_valid(payload: dict[str, Any]) -> bool | None:
    """S05's verdict: the gateway keeps it with the pipeline telemetry (top level accepted)."""
    if payload.get("schema_valid") is not None:
        return payload["schema_valid"]
    return (payload.get("pipeline") or {}).get("schema_valid")


def _in_scope(q, scope: str):
    tenant_id = scope_tenant_id(scope)
    if tenant_id is not None:
        q = q.where(LedgerEntry.tenant_id == tenant_id)
        if ":wf:" in scope:
            q = q.where(LedgerEntry.workflow == scope.split(":wf:", 1)[1])
    return q


def explore_verdict(payload: Any) -> tuple[str, str, bool] | None:
    """(request id shadowed, tier rank, agreed) of an exploration row's payload; None for
    any other row (an adapter's shadow run, a failed run)."""
    p = payload or {}
    if p.get("explore") is not True or not p.get("shadow_of") or not p.get("tier_rank"):
        return None
    if not isinstance(p.get("agreed"), bool):
        return None
    return str(p["shadow_of"]), str(int(p["tier_rank"])), p["agreed"]


def merge_shadow(own: Any, explored: dict[str, bool] | None) -> dict[str, bool] | None:
    """A request's shadow verdicts: its payload's own, then its exploration rows'."""
    if not own and not explored:
        return None
    return {**{str(k): v for k, v in (own or {}).items()}, **(explored or {})}


def serving_arms() -> dict[tuple[int, str], set[str | None]]:
    """(tenant id, workflow) -> what tier 1 answers that workflow with now: its promoted
    adapter; a canary and the arm it shares traffic with (the promoted adapter, else the
    base model, None). Workflows not listed have the base model only."""
    from app.adapters import states
    from app.adapters.models import Adapter
    found: dict[tuple[int, str], dict[str, str]] = {}
    rows = db.session.execute(db.select(Adapter.tenant_id, Adapter.workflow, Adapter.name,
                                        Adapter.state).where(Adapter.state.in_(states.SERVING))
                              .order_by(Adapter.id))
    for tenant_id, workflow, name, state in rows:
        found.setdefault((tenant_id, workflow), {})[state] = name
    out: dict[tuple[int, str], set[str | None]] = {}
    for key, by_state in found.items():
        promoted = by_state.get(states.PROMOTED)
        out[key] = {promoted} | ({by_state[states.CANARY]} if states.CANARY in by_state else set())
    return out


def adapter_shadow_verdict(payload: Any) -> tuple[str, str, bool, str] | None:
    """(request id shadowed, tier rank, agreed, adapter) of an adapter's shadow row that
    names its tier; None for any other row."""
    p = payload or {}
    if p.get("explore") or not p.get("adapter") or not p.get("shadow_of") \
            or not p.get("tier_rank") or not isinstance(p.get("agreed"), bool):
        return None
    return str(p["shadow_of"]), str(int(p["tier_rank"])), p["agreed"], str(p["adapter"])


def explored_verdicts(scope: str, since=None) -> dict[str, dict[str, bool]]:
    """request id -> {tier rank: agreed} from the exploration rows of ``scope``, and from
    the shadow rows of the adapters that serve tier 1 now.

    A tier-1 verdict counts only when tier 1 still answers that workflow with what the
    exploration asked (``payload.adapter``: the adapter, or None for the base model;
    ``serving_arms``): once an adapter is promoted, the base model's failures no longer say
    anything about tier 1, and an adapter rolled back no longer serves. An adapter's shadow
    run (same concordance rule, same routed body) is the same evidence as exploring it: once
    it serves, the router has its shadow phase's verdicts at once instead of waiting for new
    exploration."""
    q = _in_scope(db.select(LedgerEntry.tenant_id, LedgerEntry.workflow, LedgerEntry.payload)
                  .where(LedgerEntry.kind == "shadow"), scope)
    if since is not None:
        q = q.where(LedgerEntry.at >= since)
    arms = serving_arms()
    out: dict[str, dict[str, bool]] = {}
    for tenant_id, workflow, payload in db.session.execute(q):
        serving = arms.get((tenant_id, workflow or ""), {None})
        found = explore_verdict(payload)
        if found is None:
            shadowed = adapter_shadow_verdict(payload)
            if shadowed is None or shadowed[3] not in serving:
                continue
            found = shadowed[:3]
        rid, rank, agreed = found
        if rank == "1" and (payload or {}).get("adapter") not in serving:
            continue
        out.setdefault(rid, {})[rank] = agreed
    return out


def traces_from_ledger(scope: str, limit: int = 50_000) -> list[dict[str, Any]]:
    """The newest ``limit`` request rows of ``scope`` that carry router features, with
    their exploration verdicts in ``shadow``."""
    q = _in_scope(db.select(LedgerEntry).where(LedgerEntry.kind == "request",
                                               LedgerEntry.cache == "miss"), scope)
    out = []
    oldest = None
    for row in db.session.scalars(q.order_by(LedgerEntry.id.desc()).limit(limit)):
        p = row.payload or {}
        if not p.get("router_features") or not p.get("tier_rank"):
            continue
        if row.at is not None and (oldest is None or row.at < oldest):
            oldest = row.at
        out.append({"request_id": row.request_id, "features": p["router_features"],
                    "tier_rank": int(p["tier_rank"]), "prompt_tokens": row.prompt_tokens,
                    "completion_tokens": row.completion_tokens, "schema_valid": schema_valid(p),
                    **{k: p.get(k) for k in TRACE_FIELDS}})
    if out:
        # an exploration run is booked after the request it shadows, never before
        explored = explored_verdicts(scope, since=oldest)
        for t in out:
            t["shadow"] = merge_shadow(t.get("shadow"), explored.get(t["request_id"]))
    return out


def train_from_ledger(scope: str) -> dict[str, Any]:
    """What the ``router.train`` task runs: read the scope's traces, train, maybe promote."""
    from app.cascade.schedule import training_done
    from app.cascade.service import train_scope
    try:
        traces = traces_from_ledger(scope)
        model = train_scope(scope, traces)
    finally:
        training_done(scope)
    if model is None:
        return {"scope": scope, "traces": len(traces), "trained": False}
    return {"scope": scope, "traces": len(traces), "trained": True, "version": model.version,
            "status": model.status, "reason": model.metrics["comparison"]["reason"]}
