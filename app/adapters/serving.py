"""What the gateway serves of adapters, and what their shadow runs say.

- ``snapshot_entries``: the snapshot's ``adapters`` section (``app.contract.snapshot.
  AdapterEntry`` per tenant workflow): the canary (sharing its routing keys with the
  promoted adapter it would replace) or else the promoted adapter, each with the
  replicas where the engine loaded it, plus the workflow's adapter in shadow.
- (starting a shadow run, with its hot-load, is ``app.adapters.rollout.shadow``)
- ``shadow_rollup`` (task ``adapters.shadow_rollup``): the ledger's shadow rows (kind
  ``shadow``, one per shadowed request, ``payload.agreed``) counted per adapter into
  ``adapter.shadow`` = {requests, agreed, concordance, ci_low, ci_high} (Wilson 95%);
  an adapter with at least ``ADAPTERS_SHADOW_MIN_REQUESTS`` verdicts and concordance at
  or above its tenant's ``shadow_concordance`` is submitted for approval.
"""
from __future__ import annotations

import logging
from datetime import datetime, timezone
from typing import Any

import sqlalchemy as sa
from flask import current_app

from app.adapters import states
from app.adapters.models import Adapter
from app.contract.snapshot import AdapterEntry, ShadowEntry
from app.core.concordance import wilson
from app.extensions import db

log = logging.getLogger(__name__)


def loaded_replicas(adapter: Adapter | None) -> tuple[int, ...]:
    """Replica ids whose engine reported the adapter loaded (``loaded[id] == "ok"``)."""
    if adapter is None:
        return ()
    return tuple(sorted(int(rid) for rid, result in (adapter.loaded or {}).items()
                        if result == "ok" and str(rid).isdigit()))


def by_replica(pool_ids: list[int]) -> dict[int, list[dict[str, Any]]]:
    """replica id -> the adapters its engine was asked to hold, for the Pools page:
    [{id, name, state, ok, detail}] of adapters in shadow / canary / promoted on
    ``pool_ids`` (a replica whose load failed shows the failure)."""
    if not pool_ids:
        return {}
    out: dict[int, list[dict[str, Any]]] = {}
    for a in db.session.scalars(db.select(Adapter).where(
            Adapter.pool_id.in_(pool_ids), Adapter.state.in_(states.HELD))
            .order_by(Adapter.id)):
        for rid, result in (a.loaded or {}).items():
            if str(rid).isdigit():
                out.setdefault(int(rid), []).append(
                    {"id": a.id, "name": a.name, "state": a.state, "ok": result == "ok",
                     "detail": "" if result == "ok" else str(result)})
    return out


def sample_pct(adapter: Adapter) -> float:
    """The share of eligible answers shadowed: the adapter's own ``shadow.sample_pct``,
    else ``ADAPTERS_SHADOW_SAMPLE_PCT``."""
    own = (adapter.shadow or {}).get("sample_pct")
    pct = own if own is not None else current_app.config["ADAPTERS_SHADOW_SAMPLE_PCT"]
    return max(0.0, min(100.0, float(pct)))


def snapshot_entries() -> dict[str, AdapterEntry]:
    """``{"<tenant id>:<workflow signature>": AdapterEntry}`` for every workflow with an
    adapter serving (canary, promoted) or in shadow. Where a state holds more than one
    adapter of a workflow (it should not), the newest wins."""
    groups: dict[str, dict[str, Adapter]] = {}
    for a in db.session.scalars(db.select(Adapter).where(Adapter.state.in_(states.HELD))
                                .order_by(Adapter.id)):
        groups.setdefault(f"{a.tenant_id}:{a.workflow}", {})[a.state] = a
    out = {}
    for key, group in groups.items():
        canary, promoted = group.get(states.CANARY), group.get(states.PROMOTED)
        shadow = group.get(states.SHADOW)
        serving = canary or promoted
        previous = promoted if canary is not None else None
        out[key] = AdapterEntry(
            name=serving.name if serving else None,
            state=serving.state if serving else None,
            canary_pct=(serving.canary_pct if serving.state == states.CANARY else 100)
            if serving else 0,
            pool_id=serving.pool_id if serving else (shadow.pool_id if shadow else None),
            replicas_loaded=loaded_replicas(serving),
            previous_name=previous.name if previous else None,
            previous_replicas_loaded=loaded_replicas(previous),
            shadow=ShadowEntry(shadow.name, sample_pct(shadow), shadow.pool_id,
                               loaded_replicas(shadow)) if shadow else None,
            forms={a.name: dict(a.form) for a in (serving, previous, shadow)
                   if a is not None and a.form})
    return out


def kept_forms(tenant_id: int | None) -> list[tuple[Adapter, list[str]]]:
    """Adapters held (shadow, canary, promoted) of ``tenant_id`` (None: every tenant) that
    learned another served form than their tenant's policy gives now, each with the fields
    that differ (``served_form.describe``): they keep serving in their own form until
    retrained, which the policy page says after a save."""
    from app.adapters.served_form import describe
    from app.policies.service import effective_policy
    q = db.select(Adapter).where(Adapter.state.in_(states.HELD)).order_by(Adapter.id)
    if tenant_id is not None:
        q = q.where(Adapter.tenant_id == tenant_id)
    out, policies = [], {}
    for a in db.session.scalars(q):
        if not a.form:
            continue
        if a.tenant_id not in policies:
            policies[a.tenant_id] = effective_policy(a.tenant_id)
        differs = describe(a.form, policies[a.tenant_id])[1]
        if differs:
            out.append((a, differs))
    return out


# --- the shadow gate --------------------------------------------------------------------

def shadow_counts(adapter_names: list[str]) -> dict[str, tuple[int, int]]:
    """{adapter name: (verdicts, agreements)} from the ledger's shadow rows."""
    from app.ledger.models import LedgerEntry as L
    if not adapter_names:
        return {}
    agreed = L.payload["agreed"].as_boolean()
    rows = db.session.execute(
        sa.select(L.adapter, sa.func.count(),
                  sa.func.coalesce(sa.func.sum(sa.case((agreed.is_(True), 1), else_=0)), 0))
        .where(L.kind == "shadow", L.adapter.in_(adapter_names), agreed.is_not(None))
        .group_by(L.adapter))
    return {name: (int(n), int(k)) for name, n, k in rows}


def shadow_stats(requests: int, agreed: int) -> dict[str, Any]:
    low, high = wilson(agreed, requests)
    return {"requests": requests, "agreed": agreed,
            "concordance": round(agreed / requests, 6) if requests else 0.0,
            "ci_low": round(low, 6), "ci_high": round(high, 6)}


def gate_met(stats: dict[str, Any], min_requests: int, threshold: float) -> bool:
    return stats["requests"] >= min_requests and stats["concordance"] >= threshold


def shadow_rollup(min_requests: int | None = None) -> list[dict[str, Any]]:
    """Update every shadow adapter's concordance; submit those that met the gate.
    Returns one line per adapter: {id, name, submitted, **stats}."""
    from app.adapters import service
    from app.policies.service import effective_policy
    if min_requests is None:
        min_requests = int(current_app.config["ADAPTERS_SHADOW_MIN_REQUESTS"])
    adapters = list(db.session.scalars(db.select(Adapter).where(
        Adapter.state == states.SHADOW).order_by(Adapter.id)))
    counts = shadow_counts([a.name for a in adapters])
    now = datetime.now(timezone.utc).isoformat()
    out, submit = [], []
    for a in adapters:
        stats = shadow_stats(*counts.get(a.name, (0, 0)))
        a.shadow = {**(a.shadow or {}), **stats, "updated_at": now}
        threshold = float(effective_policy(a.tenant_id)["shadow_concordance"])
        met = gate_met(stats, min_requests, threshold)
        if met:
            submit.append((a, stats, threshold))
        out.append({"id": a.id, "name": a.name, "submitted": met, **stats})
    db.session.commit()
    for a, stats, threshold in submit:
        try:
            service.transition(service.SYSTEM, a, "submit", "shadow gate met",
                               data={**stats, "threshold": threshold,
                                     "min_requests": min_requests})
        except Exception:  # noqa: BLE001 - one adapter's failure leaves the others to go
            db.session.rollback()
            log.exception("adapter %s: shadow gate submit failed", a.id)
    if submit:
        # out of shadow: gateways stop shadowing it (the transition publishes only for
        # serving states)
        from app.snapshot.service import publish_after_commit
        publish_after_commit()
    return out
