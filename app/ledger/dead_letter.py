"""The ledger's dead-letter stream: events the drain could not store, kept with their
error and original payload so ingestion moves on and nothing is lost.

An entry of ``Keys.ledger_dead()`` holds the original field (``e``: one event, or ``b``:
a gateway batch that was not even readable), ``error`` (what the database or the parser
said), ``entry`` (its id on the ledger stream), ``at`` and ``attempts`` (replays so far).

``replay`` stores each event again in its own transaction, the way the drain does
(``ON CONFLICT (request_id) DO NOTHING``: an event whose row is in the ledger already
counts as a duplicate, never as a second row); an event stored is removed from the
stream, one that fails again stays with its new error.
"""
from __future__ import annotations

import logging
import re
from datetime import datetime, timezone
from typing import Any

import orjson
from sqlalchemy import exc as sa_exc

from app.errors import Forbidden, ValidationError

log = logging.getLogger(__name__)
PAYLOAD_FIELDS = (b"e", b"b")
ERROR_MAX = 1000
LIST_MAX = 500
_ENTRY_ID = re.compile(r"^\d{1,20}-\d{1,20}$")


# SQLSTATE classes that say the database cannot store anything right now (connection,
# rollback/deadlock, resources, operator intervention, system, object state) or that the
# schema is not the code's (42: an undefined column while a migration is pending): the
# batch is retried later. Any other (22 data exception, 23 constraint, P0 a trigger's
# RAISE ...) is about the event: it is dead-lettered.
_SYSTEMIC_SQLSTATE = frozenset({"08", "40", "42", "53", "54", "55", "57", "58", "HV"})


def is_transient(exc: BaseException) -> bool:
    """The database (or its connection, or its schema) failed, not the event: retry,
    don't dead-letter."""
    if isinstance(exc, sa_exc.DBAPIError) and exc.connection_invalidated:
        return True
    state = getattr(getattr(exc, "orig", None), "sqlstate", None)
    if isinstance(state, str) and len(state) == 5:
        return state[:2] in _SYSTEMIC_SQLSTATE
    return isinstance(exc, (sa_exc.OperationalError, sa_exc.InterfaceError,
                            sa_exc.DisconnectionError, sa_exc.TimeoutError))


def describe(exc: BaseException) -> str:
    """The error as an operator reads it: the database's own message, not the SQL."""
    orig = getattr(exc, "orig", None) if isinstance(exc, sa_exc.DBAPIError) else None
    err = orig or exc
    return f"{type(err).__name__}: {' '.join(str(err).split())}"[:ERROR_MAX]


def fields(original: dict, exc: BaseException | str, entry_id: Any,
           attempts: int = 0) -> dict[bytes, bytes]:
    """A dead-letter entry: the original payload field plus the error."""
    out = {k: v for k, v in original.items() if k in PAYLOAD_FIELDS}
    if not out:  # an entry with neither field: keep what it had, as JSON
        out[b"e"] = orjson.dumps({_text(k): _text(v) for k, v in original.items()})
    error = exc if isinstance(exc, str) else describe(exc)
    out[b"error"] = error[:ERROR_MAX].encode(errors="replace")
    out[b"entry"] = _text(entry_id).encode()
    out[b"at"] = datetime.now(timezone.utc).isoformat(timespec="seconds").encode()
    out[b"attempts"] = str(attempts).encode()
    return out


def _text(v: Any) -> str:
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


def _check(user) -> None:
    # Dead letters hold every tenant's events: central FinOps and admins only.
    if user is not None and not user.can("budget.manage"):
        raise Forbidden("only global FinOps admins see and replay ledger dead letters")


def _redis():
    from app.redis_client import get_redis, keys
    return get_redis(), keys().ledger_dead()


def count(user=None) -> int:
    _check(user)
    r, dead = _redis()
    return int(r.xlen(dead))


def _describe(entry_id: bytes, f: dict) -> dict[str, Any]:
    raw = f.get(b"e") or f.get(b"b") or b""
    try:
        ev = orjson.loads(raw)
    except orjson.JSONDecodeError:
        ev = None
    one = ev if isinstance(ev, dict) else {}
    return {"id": _text(entry_id), "error": _text(f.get(b"error", b"")),
            "at": _text(f.get(b"at", b"")), "attempts": int(f.get(b"attempts", b"0") or 0),
            "stream_entry": _text(f.get(b"entry", b"")),
            "request_id": _text(one.get("request_id", "")), "tenant_id": one.get("tenant_id"),
            "payload": _text(raw)[:2000]}


def listing(user=None, limit: int = 100) -> list[dict[str, Any]]:
    """The oldest ``limit`` dead letters, described."""
    _check(user)
    r, dead = _redis()
    return [_describe(i, f) for i, f in r.xrange(dead, count=max(1, min(limit, LIST_MAX)))]


def replay(user=None, ids: list[str] | None = None, limit: int = LIST_MAX) -> dict[str, int]:
    """Store dead letters again (``ids``, or the oldest ``limit``). Returns counts:
    replayed entries, rows stored, duplicates (row already in the ledger), failed."""
    from app.audit.service import record
    from app.contract import budget as budget_counters
    from app.extensions import db
    from app.ledger.service import write_each
    from app.redis_client import keys

    _check(user)
    if ids is not None and (not isinstance(ids, list) or not all(
            isinstance(i, str) and _ENTRY_ID.match(i) for i in ids)):
        raise ValidationError("ids must be a list of dead-letter ids like '1700000000000-0'",
                              {"ids": ["not a list of stream ids"]})
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= LIST_MAX:
        raise ValidationError(f"limit must be an integer from 1 to {LIST_MAX}",
                              {"limit": ["out of range"]})
    r, dead = _redis()
    if ids:
        entries = []
        for entry_id in ids[:LIST_MAX]:
            entries.extend(r.xrange(dead, min=entry_id, max=entry_id))
    else:
        entries = r.xrange(dead, count=limit)
    out = {"replayed": len(entries), "stored": 0, "duplicates": 0, "failed": 0}
    if not entries:
        return out
    k = keys()
    with budget_counters.booking_lock(r, k.ns, hold_s=30, wait_s=15):
        pipe = r.pipeline()
        for entry_id, f in entries:
            original = {key: v for key, v in f.items() if key in PAYLOAD_FIELDS}
            inserted, _created, bad, booked = write_each([(entry_id, original)])
            events = len(booked) + len(bad)
            out["stored"] += inserted
            out["duplicates"] += len(booked) - inserted
            out["failed"] += len(bad)
            attempts = int(f.get(b"attempts", b"0") or 0) + 1
            for _, again in bad:
                pipe.xadd(dead, {**again, b"entry": f.get(b"entry", b""),
                                 b"attempts": str(attempts).encode()})
            budget_counters.forget_unbooked(pipe, k.ns, booked)
            pipe.xdel(dead, entry_id)
            log.info("dead letter %s replayed: %d events, %d stored, %d still failing",
                     _text(entry_id), events, inserted, len(bad))
        pipe.execute()
    if user is not None:
        record(user, "ledger.dead_letters.replay", "ledger_dead_letter", after=out)
        db.session.commit()
    return out
