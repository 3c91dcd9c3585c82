"""Sign-in and admin-token throttling, per account and per client address (Redis).

Five failed sign-ins of one account within WINDOW_S lock that account for LOCK_S; fifty
failures from one address (any accounts, or bad admin tokens) lock the address. A lock
answers 429 with when to try again; an admin lifts it (``lift``); both are audited.
Redis unreachable: sign-in goes on unthrottled (logged), it never locks everyone out.
"""
from __future__ import annotations

import logging

from app.audit.service import record
from app.errors import Forbidden, TooManyAttempts
from app.extensions import db

log = logging.getLogger(__name__)
WINDOW_S = 15 * 60
LOCK_S = 15 * 60
LIMITS = {"account": 5, "addr": 50}


def _redis():
    from app.redis_client import get_redis, keys
    return get_redis(), keys()


def check(account: str | None, addr: str) -> None:
    """Raise TooManyAttempts when the account or the address is locked."""
    try:
        r, k = _redis()
        pipe = r.pipeline(transaction=False)
        for kind, ident in (("account", account), ("addr", addr)):
            if ident:
                pipe.ttl(k.auth_lock(kind, ident))
        ttls = [t for t in pipe.execute() if t and t > 0]
    except Exception as exc:  # noqa: BLE001 - throttling is a guard, not a gate
        log.warning("sign-in throttle unavailable: %s", exc)
        return
    if ttls:
        minutes = max(1, -(-max(ttls) // 60))
        raise TooManyAttempts(f"Too many failed attempts. Try again in {minutes} minute(s), "
                              "or ask an admin to lift the lock.")


def failed(account: str | None, addr: str) -> None:
    """Count a failure; lock what went over its limit (audited)."""
    try:
        r, k = _redis()
        for kind, ident in (("account", account), ("addr", addr)):
            if not ident:
                continue
            key = k.auth_failures(kind, ident)
            n = r.incr(key)
            if n == 1:
                r.expire(key, WINDOW_S)
            if n >= LIMITS[kind] and r.set(k.auth_lock(kind, ident), n, ex=LOCK_S, nx=True):
                record(None, "auth.lockout", kind, ident, after={"failures": n})
                db.session.commit()
    except Exception as exc:  # noqa: BLE001
        log.warning("sign-in throttle unavailable: %s", exc)


def succeeded(account: str) -> None:
    try:
        r, k = _redis()
        r.delete(k.auth_failures("account", account))
    except Exception as exc:  # noqa: BLE001
        log.warning("sign-in throttle unavailable: %s", exc)


def lift(actor, kind: str, ident: str) -> bool:
    """An admin lifts a lock (and its failure count); True when there was one."""
    if not actor.can("user.manage"):
        raise Forbidden("only admins lift sign-in locks")
    r, k = _redis()
    had = bool(r.delete(k.auth_lock(kind, ident), k.auth_failures(kind, ident)))
    record(actor, "auth.lockout_lift", kind, ident, after={"had_lock": had})
    db.session.commit()
    return had
