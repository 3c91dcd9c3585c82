"""Ledger ingest: the gateway's Redis stream -> ``ledger_entries``, exactly once per request.

A stream entry holds one event (field ``e``) or a gateway's batch of them (field ``b``,
a JSON array). Delivery is at least once (a consumer group; entries of a consumer that died before
acking are claimed again with XAUTOCLAIM) and the insert is idempotent on the unique
``request_id`` (ON CONFLICT DO NOTHING), so a crash anywhere neither loses a committed
row nor counts one twice. Entries are acked (and deleted: the stream is a queue, the
SQL ledger is the record) only after their batch committed.
"""
from __future__ import annotations

import logging
import os
import socket
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from typing import Any, Callable

import orjson
import redis as redis_lib
from flask import current_app

from app.contract import budget as budget_counters
from app.contract.events import FeedbackEvent, LedgerEvent
from app.extensions import db
from app.ledger import dead_letter
from app.ledger.models import OFF_PATH_KINDS, SAVED_COLUMNS, LedgerEntry
from app.models_base import utcnow

log = logging.getLogger(__name__)

GROUP = "ledger-drain"
FEEDBACK_GROUP = "ledger-feedback"
FEEDBACK_MAX_ATTEMPTS = 20
_COLUMNS = ("request_id", "tenant_id", "workflow", "tier", "model", "status", "cache",
            "prompt_tokens", "cached_tokens", "completion_tokens", "escalated", "ttft_ms",
            "latency_ms", "usage_source", "adapter", "tool_tokens", "tool_tokens_saved",
            "tool_retries")
# The kinds a gateway books (adjustments are written by FinOps, never from the stream).
_GATEWAY_KINDS = frozenset({"request", *OFF_PATH_KINDS})


def consumer_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


def _ensure_group(r: redis_lib.Redis, stream: str, group: str) -> None:
    try:
        r.xgroup_create(stream, group, id="0", mkstream=True)
    except redis_lib.ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


# Each column's type, applied before the insert: a malformed event raises here and is
# moved aside, instead of failing its whole batch's commit again at every drain.
_COERCE: dict[str, Callable[[Any], Any]] = {
    "status": int, "prompt_tokens": int, "cached_tokens": int, "completion_tokens": int,
    "escalated": bool, "ttft_ms": lambda v: None if v is None else float(v),
    "latency_ms": lambda v: None if v is None else float(v),
    "tier": lambda v: str(v)[:64], "model": lambda v: str(v)[:200],
    "cache": lambda v: str(v)[:16], "usage_source": lambda v: str(v)[:16],
    "adapter": lambda v: str(v or "")[:64],
    "tool_tokens": int, "tool_tokens_saved": int, "tool_retries": int}


def row_from_event(ev: LedgerEvent) -> dict[str, Any]:
    """A ledger_entries row from a gateway event (raises on a malformed one)."""
    row = {c: _COERCE.get(c, lambda v: v)(ev[c]) for c in _COLUMNS if c in ev}
    row["request_id"] = str(ev["request_id"])[:64]
    row["tenant_id"] = int(ev["tenant_id"])
    row["workflow"] = str(ev.get("workflow") or "")[:64]
    kind = ev.get("kind") or "request"
    if kind not in _GATEWAY_KINDS:
        raise ValueError(f"a gateway books no {kind!r} rows")
    row["kind"] = kind
    row["cost_usd"] = Decimal(str(ev.get("cost_usd") or 0))
    row["baseline_cost_usd"] = Decimal(str(ev.get("baseline_cost_usd") or 0))
    for col in SAVED_COLUMNS:
        row[col] = Decimal(str(ev.get(col) or 0))
    row["at"] = datetime.fromisoformat(ev["at"]) if ev.get("at") else utcnow()
    row["payload"] = ev.get("payload") or {}
    return row


def _insert_ignore(rows: list[dict]) -> int:
    """Insert rows, skipping request_ids already present; returns rows inserted."""
    if not rows:
        return 0
    dialect = db.session.get_bind().dialect.name
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    else:
        from sqlalchemy.dialects.sqlite import insert
    stmt = insert(LedgerEntry).on_conflict_do_nothing(index_elements=["request_id"])
    result = db.session.execute(stmt.returning(LedgerEntry.request_id), rows)
    return len(result.all())


def _read(r, stream: str, group: str, consumer: str, count: int, min_idle_ms: int,
          block_ms: int | None) -> list[tuple[bytes, dict]]:
    """Stale pending entries of dead consumers first, then new ones."""
    # [next id, entries] (Redis 6.2), plus the deleted ids on Redis 7
    claimed = r.xautoclaim(stream, group, consumer, min_idle_time=min_idle_ms,
                           start_id="0-0", count=count)[1]
    entries = [(i, f) for i, f in claimed if f]
    if len(entries) < count:
        got = r.xreadgroup(group, consumer, {stream: ">"}, count=count - len(entries),
                           block=block_ms)
        for _stream, items in got or []:
            entries.extend((i, f) for i, f in items if f)
    return entries


def _write_batch(entries: list[tuple[bytes, dict]]) -> tuple[int, int, list, list]:
    """Ensure workflows and insert rows in the open transaction; returns
    (rows inserted, workflows created, bad entries, (tenant_id, request_id) of every row)."""
    from app.tenants.models import Tenant
    from app.workflows.service import OVERFLOW, admit_workflows

    rows: dict[str, dict] = {}
    names: dict[tuple[int, str], str] = {}
    bad = []
    for entry_id, fields in entries:
        try:
            events = orjson.loads(fields[b"b"]) if b"b" in fields else [orjson.loads(fields[b"e"])]
            if not isinstance(events, list):
                raise ValueError("a batch entry must hold a JSON array")
        except Exception as exc:  # noqa: BLE001 - a poison entry must not block the stream
            log.error("ledger entry %s is malformed (%s); moved aside", entry_id, exc)
            bad.append((entry_id, dead_letter.fields(fields, exc, entry_id)))
            continue
        parsed = []
        for ev in events:
            try:
                parsed.append((ev, row_from_event(ev)))
            except Exception as exc:  # noqa: BLE001 - only the bad event is moved aside
                log.error("ledger entry %s holds a malformed event (%s); moved aside",
                          entry_id, exc)
                bad.append((entry_id, dead_letter.fields({b"e": orjson.dumps(ev)}, exc,
                                                         entry_id)))
        for ev, row in parsed:
            rows.setdefault(row["request_id"], row)
            if row["workflow"]:
                names.setdefault((row["tenant_id"], row["workflow"]),
                                 ev.get("workflow_name") or "")
    tenants = {t for t, _ in names}
    live = set(db.session.scalars(db.select(Tenant.id).where(Tenant.id.in_(tenants)))) \
        if tenants else set()
    created, refused = admit_workflows({p for p in names if p[0] in live}, names,
                                       int(current_app.config["WORKFLOWS_PER_TENANT_MAX"]))
    for row in rows.values():
        if (row["tenant_id"], row["workflow"]) in refused:
            row["workflow"] = OVERFLOW
    booked = [(row["tenant_id"], row["request_id"]) for row in rows.values()]
    return _insert_ignore(list(rows.values())), created, bad, booked


def write_each(entries: list[tuple[bytes, dict]]) -> tuple[int, int, list, list]:
    """A batch whose commit failed, again with one transaction per event: an event that
    still cannot be stored is returned among the bad ones (for the dead-letter stream,
    with its error) and the others land, so one poison event never stalls the stream.
    A transient error (the database went away) is raised: the entries stay pending and
    the rows committed so far are skipped on the retry (idempotent on request_id)."""
    inserted = created = 0
    bad: list = []
    booked: list = []
    for entry_id, fields in entries:
        try:
            events = orjson.loads(fields[b"b"]) if b"b" in fields else None
        except Exception:  # noqa: BLE001 - _write_batch moves the entry aside
            events = None
        singles = ([{b"e": orjson.dumps(ev)} for ev in events] if isinstance(events, list)
                   else [fields])
        for one in singles:
            try:
                i, c, b, bk = _write_batch([(entry_id, one)])
                db.session.commit()
            except Exception as exc:
                db.session.rollback()
                if dead_letter.is_transient(exc):
                    raise
                log.error("ledger entry %s: an event cannot be stored (%s); dead-lettered",
                          entry_id, dead_letter.describe(exc))
                bad.append((entry_id, dead_letter.fields(one, exc, entry_id)))
                continue
            inserted, created = inserted + i, created + c
            bad.extend(b)
            booked.extend(bk)
    return inserted, created, bad, booked


def drain_stream(max_batches: int = 20, *, batch_size: int | None = None,
                 consumer: str | None = None, min_idle_ms: int = 30_000,
                 block_ms: int | None = None,
                 on_committed: Callable[[list[bytes]], None] | None = None) -> int:
    """Move up to ``max_batches`` batches from the stream into SQL; returns rows inserted.

    ``min_idle_ms``: how long an entry must sit unacked with another consumer before it
    is taken over (a consumer that died mid-batch). ``on_committed`` sees each batch's
    entry ids after the commit and before the ack (observability, crash tests).
    """
    from app.redis_client import get_redis, keys
    r, k = get_redis(), keys()
    stream, dead = k.ledger_stream(), k.ledger_dead()
    consumer = consumer or consumer_name()
    count = batch_size or int(current_app.config["LEDGER_BATCH_SIZE"])
    _ensure_group(r, stream, GROUP)
    total = new_workflows = 0
    for _ in range(max_batches):
        entries = _read(r, stream, GROUP, consumer, count, min_idle_ms, block_ms)
        if not entries:
            break
        # Budget counters: the commit and forgetting its rows as "counted, not drained"
        # happen together with respect to a reconcile (app.contract.budget). Short hold: a
        # drain killed here stalls the next one for ``hold_s`` at most.
        with budget_counters.booking_lock(r, k.ns, hold_s=10, wait_s=15):
            try:
                inserted, created, bad, booked = _write_batch(entries)
                db.session.commit()
            except Exception as exc:
                db.session.rollback()
                if dead_letter.is_transient(exc):
                    raise  # the database is away: the batch stays pending, retried later
                log.error("ledger batch of %d entries failed (%s); storing them one by one",
                          len(entries), dead_letter.describe(exc))
                inserted, created, bad, booked = write_each(entries)
            ids = [i for i, _ in entries]
            if on_committed is not None:
                on_committed(ids)
            pipe = r.pipeline()
            for entry_id, fields in bad:
                pipe.xadd(dead, fields)
            budget_counters.forget_unbooked(pipe, k.ns, booked)
            pipe.xack(stream, GROUP, *ids)
            pipe.xdel(stream, *ids)
            pipe.execute()
        total += inserted
        new_workflows += created
    if new_workflows:
        # Gateways learn new workflows (the router's frontier-first clock) from the snapshot.
        from app.snapshot.service import publish_after_commit
        publish_after_commit()
    total_fb = drain_feedback(max_batches=max_batches, batch_size=count, consumer=consumer,
                              min_idle_ms=min_idle_ms)
    if total or total_fb:
        log.info("ledger drain: %d rows, %d feedback", total, total_fb)
    return total


def _apply_feedback(ev: FeedbackEvent) -> bool:
    """Put the verdict on the request's ledger row; False when the row is not there yet."""
    entry = db.session.scalar(db.select(LedgerEntry).where(
        LedgerEntry.request_id == ev["request_id"], LedgerEntry.tenant_id == ev["tenant_id"]))
    if entry is None:
        return False
    payload = dict(entry.payload or {})
    payload["feedback"] = {"pass": ev["pass"], "note": ev.get("note", ""), "at": ev.get("at")}
    entry.payload = payload
    return True


def drain_feedback(max_batches: int = 20, *, batch_size: int = 500, consumer: str | None = None,
                   min_idle_ms: int = 30_000) -> int:
    """Copy feedback verdicts onto ledger rows. A verdict that arrives before its row
    waits in ``<ns>:ledger:feedback_retry`` (the shared feedback stream other readers
    use is never written here) for up to FEEDBACK_MAX_ATTEMPTS drains."""
    from app.redis_client import get_redis, keys
    r, k = get_redis(), keys()
    retry_stream = k.feedback_retry()
    consumer = consumer or consumer_name()
    applied = 0
    for stream in (k.feedback_stream(), retry_stream):
        _ensure_group(r, stream, FEEDBACK_GROUP)
        for _ in range(max_batches):
            entries = _read(r, stream, FEEDBACK_GROUP, consumer, batch_size, min_idle_ms, None)
            if not entries:
                break
            retry = []
            for entry_id, fields in entries:
                try:
                    ev = orjson.loads(fields[b"e"])
                    ok = _apply_feedback(ev)
                except Exception as exc:  # noqa: BLE001
                    log.error("feedback entry %s is malformed: %s", entry_id, exc)
                    continue
                if ok:
                    applied += 1
                elif int(ev.get("attempts", 0)) < FEEDBACK_MAX_ATTEMPTS:
                    retry.append({**ev, "attempts": int(ev.get("attempts", 0)) + 1})
                else:
                    log.warning("feedback for %s dropped: no ledger row", ev.get("request_id"))
            db.session.commit()
            ids = [i for i, _ in entries]
            pipe = r.pipeline()
            for ev in retry:
                pipe.xadd(retry_stream, {"e": orjson.dumps(ev)})
            pipe.xack(stream, FEEDBACK_GROUP, *ids)
            if stream == retry_stream:
                pipe.xdel(stream, *ids)
            pipe.execute()
            if stream == retry_stream:
                break  # one pass per drain: what is still early waits for the next one
    return applied


def recent_entries(tenant_id: int | None = None, *, since: timedelta | None = None,
                   limit: int = 100) -> list[LedgerEntry]:
    q = db.select(LedgerEntry).order_by(LedgerEntry.id.desc()).limit(limit)
    if tenant_id is not None:
        q = q.where(LedgerEntry.tenant_id == tenant_id)
    if since is not None:
        q = q.where(LedgerEntry.at >= datetime.now(timezone.utc) - since)
    return list(db.session.scalars(q))
