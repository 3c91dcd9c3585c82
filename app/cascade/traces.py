"""Router training traces read from the ledger (the gateway logs them in the payload).

What the gateway writes into ``LedgerEntry.payload`` for a request to be a trace:
``router_features`` (the S01 vector), ``tier_rank`` (the tier served),
``escalated_from`` ([ranks the margin monitor aborted]) and, from S05,
``pipeline.schema_valid``; the ledger drain adds ``feedback`` (``{"pass": bool, "note",
"at"}`` from POST /v1/feedback) and shadow runs ``shadow`` ({rank: bool}).
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


def traces_from_ledger(scope: str, limit: int = 50_000) -> list[dict[str, Any]]:
    """The newest ``limit`` request rows of ``scope`` that carry router features."""
    q = db.select(LedgerEntry).where(LedgerEntry.kind == "request", LedgerEntry.cache == "miss")
    tenant_id = scope_tenant_id(scope)
    if tenant_id is not None:
        q = q.where(LedgerEntry.tenant_id == tenant_id)
        if ":wf:" in scope:
            q = q.where(LedgerEntry.workflow == scope.split(":wf:", 1)[1])
    out = []
    for row in db.session.scalars(q.order_by(LedgerEntry.id.desc()).limit(limit)):
        p = row.payload or {}
        if not p.get("router_features") or not p.get("tier_rank"):
            continue
        out.append({"request_id": row.request_id, "features": p["router_features"],
                    "tier_rank": int(p["tier_rank"]), "prompt_tokens": row.prompt_tokens,
                    "completion_tokens": row.completion_tokens, "schema_valid": schema_valid(p),
                    **{k: p.get(k) for k in TRACE_FIELDS}})
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
