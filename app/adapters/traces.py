"""Traces an adapter learns from: the gateway's trace stream -> ``adapter_traces``.

The gateway (``app.gateway.traces``) appends scrubbed frontier answers of workflows to
``Keys.trace_stream()``; ``drain_traces`` moves them into SQL the way the ledger drain
does (a consumer group, entries of a dead consumer claimed again, an insert idempotent
on ``request_id``, ack and delete only after the commit). A malformed entry is logged
and dropped: a trace is a sample, not a record.

Verdicts: ``/v1/feedback`` reaches the ledger row (``payload.feedback``, by the ledger
drain); ``refresh_verdicts`` copies them onto the workflow's traces when a dataset is
frozen, so a verdict that came late still counts.
"""
from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

import orjson
from flask import current_app

from app.adapters.models import AdapterTrace
from app.extensions import db
from app.gateway.traces import scrub, scrub_messages  # noqa: F401 (the one scrubber)
from app.ledger.models import LedgerEntry
from app.ledger.service import _ensure_group, _read, consumer_name
from app.models_base import utcnow

log = logging.getLogger(__name__)

GROUP = "adapter-traces"


def row_from_event(ev: dict[str, Any]) -> dict[str, Any]:
    """An adapter_traces row from a gateway ``TraceEvent`` (raises on a malformed one).
    Scrubbed again here: the drain does not trust every writer of the stream."""
    messages = ev["messages"]
    if not isinstance(messages, list) or not messages:
        raise ValueError("a trace needs its messages")
    rf = ev.get("response_format")
    return {"request_id": str(ev["request_id"])[:64], "tenant_id": int(ev["tenant_id"]),
            "workflow": str(ev["workflow"])[:64], "tier": str(ev.get("tier") or "")[:64],
            "at": datetime.fromisoformat(ev["at"]) if ev.get("at") else utcnow(),
            "messages": scrub_messages(messages),
            "response_format": rf if isinstance(rf, dict) else None,
            "answer": scrub(str(ev["answer"])),
            "max_tokens": _budget(ev.get("max_tokens"))}


def _budget(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and 0 < v < 2 ** 31 else None


def _insert_ignore(rows: list[dict]) -> int:
    if not rows:
        return 0
    if db.session.get_bind().dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    else:
        from sqlalchemy.dialects.sqlite import insert
    stmt = insert(AdapterTrace).on_conflict_do_nothing(index_elements=["request_id"])
    return len(db.session.execute(stmt.returning(AdapterTrace.request_id), rows).all())


def _rows(entries: list[tuple[bytes, dict]]) -> dict[str, dict]:
    rows: dict[str, dict] = {}
    for entry_id, fields in entries:
        try:
            row = row_from_event(orjson.loads(fields[b"e"]))
        except Exception as exc:  # noqa: BLE001 - a poison entry must not block the stream
            log.error("trace entry %s is malformed (%s); dropped", entry_id, exc)
            continue
        rows.setdefault(row["request_id"], row)
    return rows


def drain_traces(max_batches: int = 20, *, batch_size: int | None = None,
                 consumer: str | None = None, min_idle_ms: int = 30_000) -> int:
    """Move up to ``max_batches`` batches of traces into SQL; returns rows inserted."""
    from app.redis_client import get_redis, keys
    r, stream = get_redis(), keys().trace_stream()
    consumer = consumer or consumer_name()
    count = batch_size or int(current_app.config["ADAPTER_TRACE_BATCH_SIZE"])
    _ensure_group(r, stream, GROUP)
    total = 0
    for _ in range(max_batches):
        entries = _read(r, stream, GROUP, consumer, count, min_idle_ms, None)
        if not entries:
            break
        try:
            total += _insert_ignore(list(_rows(entries).values()))
            db.session.commit()
        except Exception:
            db.session.rollback()
            raise
        ids = [i for i, _ in entries]
        pipe = r.pipeline()
        pipe.xack(stream, GROUP, *ids)
        pipe.xdel(stream, *ids)
        pipe.execute()
    if total:
        log.info("trace drain: %d traces", total)
    return total


def refresh_verdicts(tenant_id: int, workflow: str) -> int:
    """Copy feedback verdicts from the ledger rows onto the workflow's traces (in the
    open transaction); returns traces changed."""
    traces = {t.request_id: t for t in db.session.scalars(db.select(AdapterTrace).where(
        AdapterTrace.tenant_id == tenant_id, AdapterTrace.workflow == workflow))}
    changed = 0
    ids = list(traces)
    for i in range(0, len(ids), 1000):
        for rid, payload in db.session.execute(
                db.select(LedgerEntry.request_id, LedgerEntry.payload).where(
                    LedgerEntry.tenant_id == tenant_id,
                    LedgerEntry.request_id.in_(ids[i:i + 1000]))):
            feedback = (payload or {}).get("feedback")
            if not isinstance(feedback, dict) or "pass" not in feedback:
                continue
            verdict = "pass" if feedback["pass"] else "fail"
            if traces[rid].verdict != verdict:
                traces[rid].verdict = verdict
                changed += 1
    return changed


def count_usable(tenant_id: int, workflow: str) -> int:
    """Traces of the workflow a dataset may use (all but those a validator failed)."""
    return db.session.scalar(db.select(db.func.count()).select_from(AdapterTrace).where(
        AdapterTrace.tenant_id == tenant_id, AdapterTrace.workflow == workflow,
        db.or_(AdapterTrace.verdict.is_(None), AdapterTrace.verdict != "fail"))) or 0
