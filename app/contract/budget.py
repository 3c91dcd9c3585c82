"""Real-time budget enforcement on Redis counters (no Flask, no SQL: the gateway calls it).

Keys (``ns`` is the configured Redis namespace):

- ``<ns>:budget:<tenant_id>:<YYYY-MM>``           spent this month, integer micro-dollars
- ``<ns>:budget:<tenant_id>:<YYYY-MM>:reserved``  estimates of requests in flight
- ``<ns>:budget:<tenant_id>:limit``               hash: limit_micro, action, tenant_name
- ``<ns>:budget:<tenant_id>:<YYYY-MM>:refused``   set by the first hard-stop refusal of
  the month (spent + in flight + the refused estimate, micro-dollars): the budget is at
  100% even though ``spent`` stays below the limit (a hard stop refuses before it).

- ``<ns>:budget:<tenant_id>:unbooked``            hash: request_id -> "YYYY-MM:micro:epoch",
  requests a gateway counted (budgeted tenants, cost > 0) whose ledger row is not in SQL
  yet; the ledger drain removes them when it commits their rows
- ``<ns>:budget:booking_lock``                    held by the drain around commit + forget,
  and by the reconcile around ledger sum + correct

The month is part of the key, so a new month starts at zero by construction. ``reserve``
and ``settle`` are single Lua scripts, so concurrent gateways cannot both take the last
dollars: a hard stop refuses when spent + in-flight reservations + estimate > limit.
Every reservation must be settled (with actual 0 when the request failed).

A gateway's reservation is a lease (``hold``): the same script records it in its
instance's holds hash (``app.contract.leases``) with a deadline, and ``settle`` returns
it only if the hold is still there (HDEL), so a hold the reaper already gave back (its
gateway died, or its deadline passed) is never taken off the counter twice. Invariant:
``reserved`` == the sum of the live holds.

Reconciling with the ledger (``correct_spent``), both ways: the counter is set to the
ledger's sum plus what is counted but not yet drained (the unbooked hash), in one script,
while the booking lock keeps the drain from committing rows between the SQL sum and the
script. In-flight reservations are a separate key and never touched. So a reconcile
changes nothing unless Redis really drifted (lost counts, a failed settle, a lost event),
and then it corrects it down as well as up.
"""
from __future__ import annotations

import contextlib
import logging
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from decimal import Decimal
from typing import Any, Iterable, Iterator

from app.contract.inflight import Lua
from app.contract.keys import Keys
from app.core.costing import format_usd, from_micro, to_micro

log = logging.getLogger(__name__)
UNBOOKED_MAX_AGE_S = 6 * 3600  # an undrained count older than this lost its ledger event

COUNTER_TTL_S = 70 * 24 * 3600  # a month's counters outlive the month for reconciling
OK, NO_BUDGET, OVER_ALERT_ONLY = "ok", "no_budget", "over_budget_alert_only"

_RESERVE = """
local est = tonumber(ARGV[1])
local spent = tonumber(redis.call('GET', KEYS[1]) or '0')
local reserved = tonumber(redis.call('GET', KEYS[2]) or '0')
local limit = redis.call('HGET', KEYS[3], 'limit_micro')
if limit then
  limit = tonumber(limit)
  local action = redis.call('HGET', KEYS[3], 'action') or 'alert'
  if action == 'hard_stop' and (spent >= limit or spent + reserved + est > limit) then
    local name = redis.call('HGET', KEYS[3], 'tenant_name') or ''
    redis.call('SET', KEYS[4], spent + reserved + est, 'NX', 'EX', ARGV[2])
    return {0, 'budget_exceeded', spent, reserved, limit, name}
  end
end
redis.call('INCRBY', KEYS[2], est)
redis.call('EXPIRE', KEYS[2], ARGV[2])
if KEYS[5] then
  redis.call('HSET', KEYS[5], ARGV[3], KEYS[2] .. '|' .. ARGV[1] .. '|' .. ARGV[4])
end
if not limit then return {1, 'no_budget', spent, reserved + est, -1, ''} end
if spent + est > limit then return {1, 'over_budget_alert_only', spent, reserved + est, limit, ''} end
return {1, 'ok', spent, reserved + est, limit, ''}
"""

_SETTLE = """
local r = tonumber(redis.call('GET', KEYS[2]) or '0')
local dec = math.min(tonumber(ARGV[1]), r)
if KEYS[5] and redis.call('HDEL', KEYS[5], ARGV[6]) == 0 then
  -- the hold is gone: given back by the reaper (or, for a retry, settled already)
  if ARGV[7] == '1' then return tonumber(redis.call('GET', KEYS[1]) or '0') end
  dec = 0
end
if dec > 0 then redis.call('DECRBY', KEYS[2], dec) end
local spent = redis.call('INCRBY', KEYS[1], ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[3])
if ARGV[4] ~= '' and tonumber(ARGV[2]) ~= 0 and redis.call('EXISTS', KEYS[3]) == 1 then
  redis.call('HSET', KEYS[4], ARGV[4], ARGV[5])
  redis.call('EXPIRE', KEYS[4], ARGV[3])
end
return spent
"""

# Set the month's counter to the ledger's sum (ARGV[1]) plus the month's counted but
# undrained requests. ARGV[5..]: unbooked ids found in the ledger already (drained before
# their settle); entries older than ARGV[4] (epoch) lost their event and are dropped.
_CORRECT = """
for i = 5, #ARGV do redis.call('HDEL', KEYS[2], ARGV[i]) end
local pending = 0
local all = redis.call('HGETALL', KEYS[2])
for j = 1, #all, 2 do
  local p, micro, at = string.match(all[j + 1], '^(.+):(%-?%d+):(%d+)$')
  if (not p) or tonumber(at) < tonumber(ARGV[4]) then
    redis.call('HDEL', KEYS[2], all[j])
  elseif p == ARGV[2] then
    pending = pending + tonumber(micro)
  end
end
local cur = tonumber(redis.call('GET', KEYS[1]) or '0')
local want = tonumber(ARGV[1]) + pending
redis.call('SET', KEYS[1], want, 'EX', ARGV[3])
return {cur, want, pending}
"""

_UNLOCK = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


# Every request runs both (reserve before upstream, settle after): by sha1 (EVALSHA), so the
# script text is not sent and hashed again per call; EVALSHA's NoScriptError means the
# script did not run, so the fallback EVAL never applies a settle twice.
_RESERVE_SCRIPT = Lua(_RESERVE)
_SETTLE_SCRIPT = Lua(_SETTLE)


def current_period(now: datetime | None = None) -> str:
    return (now or datetime.now(timezone.utc)).astimezone(timezone.utc).strftime("%Y-%m")


def period_end(period: str) -> datetime:
    year, month = map(int, period.split("-"))
    return datetime(year + month // 12, month % 12 + 1, 1, tzinfo=timezone.utc)


def spent_key(ns: str, tenant_id: int, period: str) -> str:
    return Keys(ns).budget_spent(tenant_id, period)


def reserved_key(ns: str, tenant_id: int, period: str) -> str:
    return Keys(ns).budget_reserved(tenant_id, period)


def refused_key(ns: str, tenant_id: int, period: str) -> str:
    return Keys(ns).budget_refused(tenant_id, period)


def unbooked_key(ns: str, tenant_id: int) -> str:
    return Keys(ns).budget_unbooked(tenant_id)


def limit_key(ns: str, tenant_id: int) -> str:
    return Keys(ns).budget_limit(tenant_id)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def exhausted_message(tenant: str, limit_micro: int, spent_micro: int, period: str) -> str:
    return (f"Monthly budget of {format_usd(from_micro(limit_micro))} for tenant {tenant} is "
            f"exhausted (spent {format_usd(from_micro(spent_micro))} in {period}; requests in "
            f"flight count against it). It resets at "
            f"{period_end(period).strftime('%Y-%m-%dT%H:%MZ')}, or ask a FinOps admin to "
            f"raise it.")


def error_body(reason: str) -> dict[str, Any]:
    """The gateway's 429 body for a refused ``reserve`` (``reason`` is its message)."""
    return {"error": {"message": reason, "type": "insufficient_quota", "param": None,
                      "code": "budget_exceeded"}}


def _reserve_call(ns: str, tenant_id: int, estimate_usd: Any, period: str | None,
                  hold: "Hold | None" = None):
    period = period or current_period()
    keys = [spent_key(ns, tenant_id, period), reserved_key(ns, tenant_id, period),
            limit_key(ns, tenant_id), refused_key(ns, tenant_id, period)]
    args = [max(to_micro(estimate_usd, round_up=True), 0), COUNTER_TTL_S]
    if hold is not None:
        keys.append(hold.holds_key)
        args += [hold.request_id, int(time.time() + hold.lease_s)]
    return keys, args, period


def _reserve_result(raw: list, tenant_id: int, period: str) -> tuple[bool, str]:
    allowed, status = int(raw[0]) == 1, _text(raw[1])
    if allowed:
        return True, status
    name = _text(raw[5]) or str(tenant_id)
    return False, exhausted_message(name, int(raw[4]), int(raw[2]), period)


@dataclass(frozen=True)
class Hold:
    """A reservation as a lease: recorded under its gateway instance's holds hash
    (``Keys.budget_holds``) as ``request_id``, given back by the reaper after ``lease_s``
    or when the instance's heartbeat is gone."""
    holds_key: str
    request_id: str
    lease_s: float = 900.0


def reserve(redis, ns: str, tenant_id: int, estimate_usd: Decimal | float,
            period: str | None = None, hold: Hold | None = None) -> tuple[bool, str]:
    """Before sending upstream: hold ``estimate_usd`` against the tenant's month. Returns
    (allowed, reason); reason is 'ok', 'no_budget', 'over_budget_alert_only' or, when
    refused, the message for the 429 body. Pass the same ``period`` (and ``hold``) to
    ``settle``."""
    keys, args, period = _reserve_call(ns, tenant_id, estimate_usd, period, hold)
    return _reserve_result(_RESERVE_SCRIPT(redis, keys, args), tenant_id, period)


async def areserve(redis, ns: str, tenant_id: int, estimate_usd: Decimal | float,
                   period: str | None = None, hold: Hold | None = None) -> tuple[bool, str]:
    keys, args, period = _reserve_call(ns, tenant_id, estimate_usd, period, hold)
    raw = await _RESERVE_SCRIPT.acall(redis, keys, args)
    return _reserve_result(raw, tenant_id, period)


def _settle_call(ns, tenant_id, reserved_usd, actual_usd, period, request_id, hold,
                 retry=False):
    period = period or current_period()
    actual = to_micro(actual_usd)
    keys = [spent_key(ns, tenant_id, period), reserved_key(ns, tenant_id, period),
            limit_key(ns, tenant_id), unbooked_key(ns, tenant_id)]
    args = [max(to_micro(reserved_usd, round_up=True), 0), actual, COUNTER_TTL_S,
            request_id or "", f"{period}:{actual}:{int(time.time())}"]
    if hold is not None:
        keys.append(hold.holds_key)
        args += [hold.request_id, "1" if retry else "0"]
    return keys, args


def settle(redis, ns: str, tenant_id: int, reserved_usd: Decimal | float,
           actual_usd: Decimal | float, period: str | None = None,
           request_id: str | None = None, hold: Hold | None = None) -> int:
    """After the response: release the reservation and count the actual cost (0 for a
    failed request or a cache hit). With ``request_id`` (the ledger row's), a budgeted
    tenant's count is remembered as unbooked until the drain commits the row, so a
    reconcile can tell it from drift. With ``hold``, the reservation is released only if
    the reaper has not given it back already. Returns the month's spent micro-dollars."""
    keys, args = _settle_call(ns, tenant_id, reserved_usd, actual_usd, period, request_id,
                              hold)
    return int(_SETTLE_SCRIPT(redis, keys, args))


async def asettle(redis, ns: str, tenant_id: int, reserved_usd: Decimal | float,
                  actual_usd: Decimal | float, period: str | None = None,
                  request_id: str | None = None, hold: Hold | None = None,
                  retry: bool = False) -> int:
    """``retry``: a settle sent again after an error (its reply may have been lost), so
    with a ``hold`` it is applied only while the hold is still there (at most once)."""
    keys, args = _settle_call(ns, tenant_id, reserved_usd, actual_usd, period, request_id,
                              hold, retry)
    return int(await _SETTLE_SCRIPT.acall(redis, keys, args))


def state(redis, ns: str, tenant_id: int, period: str | None = None) -> dict[str, Any]:
    """Spent, in flight and limit (micro-dollars; limit None without a budget), and
    ``refused_micro``: what the month's first hard-stop refusal would have made it
    (None: nothing refused yet)."""
    period = period or current_period()
    spent, reserved, refused = redis.mget(spent_key(ns, tenant_id, period),
                                          reserved_key(ns, tenant_id, period),
                                          refused_key(ns, tenant_id, period))
    limit = redis.hgetall(limit_key(ns, tenant_id))
    limit = {_text(k): _text(v) for k, v in limit.items()}
    return {"period": period, "spent_micro": int(spent or 0), "reserved_micro": int(reserved or 0),
            "limit_micro": int(limit["limit_micro"]) if "limit_micro" in limit else None,
            "action": limit.get("action"),
            "refused_micro": int(refused) if refused is not None else None}


def mirror_limit(redis, ns: str, tenant_id: int, limit_usd: Decimal | None, action: str = "",
                 tenant_name: str = "") -> None:
    """Publish a saved budget to Redis (None removes it). A changed budget forgets this
    month's refusal: it is judged against the new limit."""
    key = limit_key(ns, tenant_id)
    redis.delete(refused_key(ns, tenant_id, current_period()))
    if limit_usd is None:
        redis.delete(key)
        return
    redis.hset(key, mapping={"limit_micro": to_micro(limit_usd), "action": action,
                             "tenant_name": tenant_name})


def add_spend(redis, ns: str, tenant_id: int, amount_usd: Decimal, period: str) -> int:
    """Count an amount outside a request (an adjustment: credits are negative)."""
    return settle(redis, ns, tenant_id, 0, amount_usd, period)


def unbooked_ids(redis, ns: str, tenant_id: int) -> list[str]:
    return [_text(k) for k in redis.hkeys(unbooked_key(ns, tenant_id))]


def forget_unbooked(pipe, ns: str, booked: Iterable[tuple[int, str]]) -> None:
    """Queue on ``pipe`` the removal of (tenant_id, request_id) pairs whose ledger rows
    were committed (the drain calls this under ``booking_lock``)."""
    by_tenant: dict[int, list[str]] = {}
    for tenant_id, request_id in booked:
        by_tenant.setdefault(int(tenant_id), []).append(request_id)
    for tenant_id, ids in by_tenant.items():
        pipe.hdel(unbooked_key(ns, tenant_id), *ids)


@contextlib.contextmanager
def booking_lock(redis, ns: str, *, hold_s: float = 60.0, wait_s: float = 30.0
                 ) -> Iterator[bool]:
    """Serialise "commit ledger rows + forget them as unbooked" (the drain, adjustments)
    with "sum the ledger + correct the counters" (the reconcile). Yields whether the lock
    was taken: after ``wait_s`` the caller goes on without it (the ledger must not stall;
    the next reconcile repairs what a race skews)."""
    key, token = Keys(ns).budget_booking_lock(), uuid.uuid4().hex
    deadline = time.monotonic() + wait_s
    held = False
    while True:
        try:
            held = bool(redis.set(key, token, nx=True, px=int(hold_s * 1000)))
        except Exception as exc:  # noqa: BLE001 - Redis down: the ledger still commits
            log.warning("budget booking lock unavailable: %s", exc)
            break
        if held or time.monotonic() > deadline:
            break
        time.sleep(0.005)
    if not held:
        log.warning("went on without the budget booking lock")
    try:
        yield held
    finally:
        if held:
            with contextlib.suppress(Exception):
                redis.eval(_UNLOCK, 1, key, token)


def correct_spent(redis, ns: str, tenant_id: int, period: str, ledger_usd: Decimal,
                  booked_ids: Iterable[str] = (), *,
                  max_age_s: float = UNBOOKED_MAX_AGE_S) -> tuple[int, int, int]:
    """Set the month's counter to ``ledger_usd`` (the ledger's sum, read under
    ``booking_lock``) plus the month's unbooked counts; ``booked_ids``: unbooked ids the
    caller found in the ledger (forgotten here, not counted twice). Returns (before,
    after, pending) micro-dollars."""
    keys = [spent_key(ns, tenant_id, period), unbooked_key(ns, tenant_id)]
    before, after, pending = redis.eval(
        _CORRECT, len(keys), *keys, to_micro(ledger_usd), period, COUNTER_TTL_S,
        int(time.time() - max_age_s), *booked_ids)
    return int(before), int(after), int(pending)
