"""Real-time budget enforcement on Redis counters (no Flask, no SQL: the gateway calls it).

Keys (``ns`` is the configured Redis namespace):

- ``<ns>:budget:<tenant_id>:<YYYY-MM>``           spent this month, integer micro-dollars
- ``<ns>:budget:<tenant_id>:<YYYY-MM>:reserved``  estimates of requests in flight
- ``<ns>:budget:<tenant_id>:limit``               hash: limit_micro, action, tenant_name
- ``<ns>:budget:<tenant_id>:<YYYY-MM>:refused``   set by the first hard-stop refusal of
  the month (spent + in flight + the refused estimate, micro-dollars): the budget is at
  100% even though ``spent`` stays below the limit (a hard stop refuses before it).

The month is part of the key, so a new month starts at zero by construction. ``reserve``
and ``settle`` are single Lua scripts, so concurrent gateways cannot both take the last
dollars: a hard stop refuses when spent + in-flight reservations + estimate > limit.
Every reservation must be settled (with actual 0 when the request failed).
"""
from __future__ import annotations

from datetime import datetime, timezone
from decimal import Decimal
from typing import Any

from app.core.costing import from_micro, to_micro

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
if not limit then return {1, 'no_budget', spent, reserved + est, -1, ''} end
if spent + est > limit then return {1, 'over_budget_alert_only', spent, reserved + est, limit, ''} end
return {1, 'ok', spent, reserved + est, limit, ''}
"""

_SETTLE = """
local r = tonumber(redis.call('GET', KEYS[2]) or '0')
local dec = math.min(tonumber(ARGV[1]), r)
if dec > 0 then redis.call('DECRBY', KEYS[2], dec) end
local spent = redis.call('INCRBY', KEYS[1], ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[3])
return spent
"""

# Set the month's counter from the ledger: never below what Redis already counted unless
# forced (the ledger lags the gateway by the stream backlog).
_CORRECT = """
local cur = tonumber(redis.call('GET', KEYS[1]) or '0')
local want = tonumber(ARGV[1])
if ARGV[2] == '1' or want > cur then
  redis.call('SET', KEYS[1], want, 'EX', ARGV[3])
  return {cur, want}
end
return {cur, cur}
"""


def current_period(now: datetime | None = None) -> str:
    return (now or datetime.now(timezone.utc)).astimezone(timezone.utc).strftime("%Y-%m")


def period_end(period: str) -> datetime:
    year, month = map(int, period.split("-"))
    return datetime(year + month // 12, month % 12 + 1, 1, tzinfo=timezone.utc)


def spent_key(ns: str, tenant_id: int, period: str) -> str:
    return f"{ns}:budget:{tenant_id}:{period}"


def reserved_key(ns: str, tenant_id: int, period: str) -> str:
    return f"{ns}:budget:{tenant_id}:{period}:reserved"


def refused_key(ns: str, tenant_id: int, period: str) -> str:
    return f"{ns}:budget:{tenant_id}:{period}:refused"


def limit_key(ns: str, tenant_id: int) -> str:
    return f"{ns}:budget:{tenant_id}:limit"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def exhausted_message(tenant: str, limit_micro: int, spent_micro: int, period: str) -> str:
    return (f"Monthly budget of ${from_micro(limit_micro):,.2f} for tenant {tenant} is "
            f"exhausted (spent ${from_micro(spent_micro):,.2f} in {period}; requests in "
            f"flight count against it). It resets at "
            f"{period_end(period).strftime('%Y-%m-%dT%H:%MZ')}, or ask a FinOps admin to "
            f"raise it.")


def error_body(reason: str) -> dict[str, Any]:
    """The gateway's 429 body for a refused ``reserve`` (``reason`` is its message)."""
    return {"error": {"message": reason, "type": "insufficient_quota", "param": None,
                      "code": "budget_exceeded"}}


def _reserve_call(ns: str, tenant_id: int, estimate_usd: Any, period: str | None):
    period = period or current_period()
    keys = [spent_key(ns, tenant_id, period), reserved_key(ns, tenant_id, period),
            limit_key(ns, tenant_id), refused_key(ns, tenant_id, period)]
    return keys, [max(to_micro(estimate_usd, round_up=True), 0), COUNTER_TTL_S], period


def _reserve_result(raw: list, tenant_id: int, period: str) -> tuple[bool, str]:
    allowed, status = int(raw[0]) == 1, _text(raw[1])
    if allowed:
        return True, status
    name = _text(raw[5]) or str(tenant_id)
    return False, exhausted_message(name, int(raw[4]), int(raw[2]), period)


def reserve(redis, ns: str, tenant_id: int, estimate_usd: Decimal | float,
            period: str | None = None) -> tuple[bool, str]:
    """Before sending upstream: hold ``estimate_usd`` against the tenant's month. Returns
    (allowed, reason); reason is 'ok', 'no_budget', 'over_budget_alert_only' or, when
    refused, the message for the 429 body. Pass the same ``period`` to ``settle``."""
    keys, args, period = _reserve_call(ns, tenant_id, estimate_usd, period)
    return _reserve_result(redis.eval(_RESERVE, len(keys), *keys, *args), tenant_id, period)


async def areserve(redis, ns: str, tenant_id: int, estimate_usd: Decimal | float,
                   period: str | None = None) -> tuple[bool, str]:
    keys, args, period = _reserve_call(ns, tenant_id, estimate_usd, period)
    raw = await redis.eval(_RESERVE, len(keys), *keys, *args)
    return _reserve_result(raw, tenant_id, period)


def _settle_call(ns, tenant_id, reserved_usd, actual_usd, period):
    period = period or current_period()
    keys = [spent_key(ns, tenant_id, period), reserved_key(ns, tenant_id, period)]
    return keys, [max(to_micro(reserved_usd, round_up=True), 0), to_micro(actual_usd),
                  COUNTER_TTL_S]


def settle(redis, ns: str, tenant_id: int, reserved_usd: Decimal | float,
           actual_usd: Decimal | float, period: str | None = None) -> int:
    """After the response: release the reservation and count the actual cost (0 for a
    failed request or a cache hit). Returns the month's spent micro-dollars."""
    keys, args = _settle_call(ns, tenant_id, reserved_usd, actual_usd, period)
    return int(redis.eval(_SETTLE, len(keys), *keys, *args))


async def asettle(redis, ns: str, tenant_id: int, reserved_usd: Decimal | float,
                  actual_usd: Decimal | float, period: str | None = None) -> int:
    keys, args = _settle_call(ns, tenant_id, reserved_usd, actual_usd, period)
    return int(await redis.eval(_SETTLE, len(keys), *keys, *args))


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


def correct_spent(redis, ns: str, tenant_id: int, period: str, ledger_usd: Decimal, *,
                  force: bool = False) -> tuple[int, int]:
    """Set the month's counter from the ledger sum. Without ``force`` it only raises the
    counter (Redis lost counts); with it (the ledger stream drained) it sets it exactly.
    Returns (before, after) micro-dollars."""
    before, after = redis.eval(_CORRECT, 1, spent_key(ns, tenant_id, period),
                               to_micro(ledger_usd), "1" if force else "0", COUNTER_TTL_S)
    return int(before), int(after)
