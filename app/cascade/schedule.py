"""Which router scopes to train, decided from the ledger (the beat's ``router.schedule_training``).

A scope is due when its labelled traces could train a cheaper tier (one has at least
``ROUTER_MIN_LABELS`` labels after the held-out share is set aside; a tier with fewer is left
out of the version, which then never routes there) and, once a version
exists, when at least ``ROUTER_RETRAIN_MIN_NEW_LABELS`` labelled traces arrived after that
version was trained, or when tier 1 changed what it answers the workflow with (an adapter
promoted, canaried or rolled back) after that version: its tier-1 model is then of another
arm. Scopes are each tenant and each of its workflows
("tenant:<id>", "tenant:<id>:wf:<workflow>"), over requests of the last
``ROUTER_TRAIN_WINDOW_DAYS``. Only the label-bearing parts of the payload are read, not the
feature vectors; tier-1 exploration verdicts (``app.cascade.traces``) count as labels. A label given late (feedback on a request older than the last version)
is not counted as new; the next retrain still uses it.
"""
from __future__ import annotations

import logging
import math
from collections import defaultdict
from datetime import datetime, timedelta, timezone
from typing import Any

from flask import current_app

from app.extensions import db
from app.ledger.models import LedgerEntry
from app.cascade import evaluation as ev
from app.cascade.models import RouterModel
from app.cascade.traces import explored_verdicts, merge_shadow

log = logging.getLogger(__name__)
N_TIERS = 3
QUEUED_TTL_S = 3600  # one train per scope in flight at a time (a lock that expires)



def _label_rows(since: datetime):
    p = LedgerEntry.payload
    q = db.select(LedgerEntry.request_id, LedgerEntry.tenant_id, LedgerEntry.workflow,
                  LedgerEntry.at, p["tier_rank"],
                  p["feedback"], p["schema_valid"], p["pipeline"]["schema_valid"], p["shadow"],
                  p["escalated_from"], p["router_features"][0]).where(
        LedgerEntry.kind == "request", LedgerEntry.cache == "miss", LedgerEntry.at >= since)
    return db.session.execute(q)


def _last_trained() -> dict[str, datetime]:
    q = db.select(RouterModel.scope, db.func.max(RouterModel.created_at)).group_by(RouterModel.scope)
    return {scope: at for scope, at in db.session.execute(q)}


def _arm_changes() -> dict[str, datetime]:
    """Workflow scope -> when tier 1 last changed what it answers that workflow with (an
    adapter entered or left canary/promoted)."""
    from app.adapters import states
    from app.adapters.models import Adapter, AdapterEvent
    q = (db.select(Adapter.tenant_id, Adapter.workflow, db.func.max(AdapterEvent.at))
         .join(AdapterEvent, AdapterEvent.adapter_id == Adapter.id)
         .where(db.or_(AdapterEvent.to_state.in_(states.SERVING),
                       AdapterEvent.from_state.in_(states.SERVING)))
         .group_by(Adapter.tenant_id, Adapter.workflow))
    return {f"tenant:{t}:wf:{w}": _aware(at) for t, w, at in db.session.execute(q) if at}


def _aware(at: datetime) -> datetime:
    return at if at.tzinfo is not None else at.replace(tzinfo=timezone.utc)


def due_scopes(now: datetime | None = None) -> list[dict[str, Any]]:
    """The scopes due for training, with their label counts (tiers 1..N-1, new since the
    last version), most new labels first."""
    now = now or datetime.now(timezone.utc)
    since = now - timedelta(days=float(current_app.config["ROUTER_TRAIN_WINDOW_DAYS"]))
    heldout = float(current_app.config["ROUTER_HELDOUT_FRACTION"])
    need = math.ceil(int(current_app.config["ROUTER_MIN_LABELS"]) / max(1e-6, 1.0 - heldout))
    min_new = int(current_app.config["ROUTER_RETRAIN_MIN_NEW_LABELS"])
    trained = {s: _aware(at) for s, at in _last_trained().items()}
    arm_changed = _arm_changes()
    counts: dict[str, dict[str, Any]] = defaultdict(
        lambda: {"tiers": [0] * (N_TIERS - 1), "labelled": 0, "new": 0})
    explored = explored_verdicts("global", since=since)
    for rid, tenant_id, workflow, at, rank, fb, sv_top, sv_pipe, shadow, esc, feat0 \
            in _label_rows(since):
        if feat0 is None or not rank:
            continue
        shadow = merge_shadow(shadow, explored.get(rid))
        labels = ev.tier_labels({"tier_rank": rank, "feedback": fb, "shadow": shadow,
                                 "schema_valid": sv_top if sv_top is not None else sv_pipe,
                                 "escalated_from": esc}, N_TIERS)
        if all(v is None for v in labels):
            continue
        scopes = [f"tenant:{tenant_id}"] + ([f"tenant:{tenant_id}:wf:{workflow}"] if workflow else [])
        for scope in scopes:
            c = counts[scope]
            c["labelled"] += 1
            for r in range(N_TIERS - 1):
                c["tiers"][r] += labels[r] is not None
            last = trained.get(scope)
            if last is None or _aware(at) > last:
                c["new"] += 1
    due = []
    for scope, c in counts.items():
        if max(c["tiers"]) < need:   # a tier without enough labels is left out of the version
            continue
        changed = arm_changed.get(scope)
        stale = changed is not None and scope in trained and trained[scope] < changed
        if scope in trained and c["new"] < min_new and not stale:
            continue
        due.append({"scope": scope, **c,
                    "tiers": {str(r + 1): n for r, n in enumerate(c["tiers"])}})
    due.sort(key=lambda d: (-d["new"], d["scope"]))
    return due


def _queued_key(scope: str) -> str:
    from app.redis_client import keys
    return keys().router_train_queued(scope)


def enqueue_due_training(now: datetime | None = None) -> list[str]:
    """Send ``router.train`` for every due scope not already queued within the hour."""
    from app.redis_client import get_redis
    r = get_redis()
    celery = current_app.extensions["celery"]
    sent = []
    for d in due_scopes(now):
        if not r.set(_queued_key(d["scope"]), "1", nx=True, ex=QUEUED_TTL_S):
            continue
        celery.send_task("router.train", args=[d["scope"]])
        log.info("router %s: training queued (%d labelled, %d new)", d["scope"],
                 d["labelled"], d["new"])
        sent.append(d["scope"])
    return sent


def training_done(scope: str) -> None:
    """Release the scope's queued mark (the train task calls this when it finishes)."""
    from app.redis_client import get_redis
    try:
        get_redis().delete(_queued_key(scope))
    except Exception as exc:  # noqa: BLE001 - the mark expires on its own
        log.warning("router %s: queued mark not cleared: %s", scope, exc)
