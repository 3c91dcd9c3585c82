"""Budget holds as leases of a gateway instance (no Flask, no SQL).

Each gateway process is an *instance* with an id (``new_instance_id``). While it runs it
renews ``Keys.gateway_alive(id)`` (TTL a few heartbeats) and stays in
``Keys.gateway_instances()``. Every hold it reserves is recorded, by the same Lua script
that raises the tenant's ``reserved`` counter (``app.contract.budget``), in
``Keys.budget_holds(id)`` as ``request_id -> "<reserved key>|<micro>|<deadline>"``; the
settle removes it with the same script that lowers the counter.

``reap`` gives back, atomically per instance, every hold whose owner's heartbeat is gone
(the gateway was killed) or whose deadline passed (a leak in a live one), and forgets an
instance with nothing left. A hold is taken off its counter by whoever removes it from
the hash first (settle or reaper, HDEL decides), never twice. So at every moment a
tenant's ``reserved`` counter equals the sum of its live holds, and a killed gateway's
holds are back at 0 one heartbeat TTL plus one reaper pass later (a Celery beat task,
and every gateway at start).
"""
from __future__ import annotations

import os
import socket
import time
import uuid
from typing import Any

from app.contract.keys import Keys

HEARTBEAT_TTL_FACTOR = 3  # the heartbeat key lives this many heartbeat intervals

_REAP = """
local dead = redis.call('EXISTS', KEYS[1]) == 0
local n, returned = 0, 0
for i = 3, #ARGV do
  local v = redis.call('HGET', KEYS[2], ARGV[i])
  if v then
    local key, micro, deadline = string.match(v, '^(.+)|(%-?%d+)|(%d+)$')
    if (not key) or dead or tonumber(deadline) < tonumber(ARGV[1]) then
      redis.call('HDEL', KEYS[2], ARGV[i])
      if key then
        local cur = tonumber(redis.call('GET', key) or '0')
        local dec = math.min(tonumber(micro), cur)
        if dec > 0 then redis.call('DECRBY', key, dec) end
        returned = returned + dec
      end
      n = n + 1
    end
  end
end
if dead and redis.call('HLEN', KEYS[2]) == 0 then redis.call('SREM', KEYS[3], ARGV[2]) end
return {n, returned}
"""


def new_instance_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def heartbeat_commands(pipe, keys: Keys, instance: str, interval_s: float) -> None:
    """Queue one heartbeat on ``pipe`` (sync or async pipeline)."""
    pipe.set(keys.gateway_alive(instance), int(time.time()),
             px=int(interval_s * HEARTBEAT_TTL_FACTOR * 1000))
    pipe.sadd(keys.gateway_instances(), instance)


def _plan(held: dict) -> tuple[list[str], list[str]]:
    """(fields, distinct reserved-counter keys) of a holds hash."""
    fields, counters = [], set()
    for field, value in held.items():
        fields.append(_text(field))
        counters.add(_text(value).rsplit("|", 2)[0])
    return fields, sorted(counters)


def reap(redis, keys: Keys, *, now: float | None = None,
         instances: list[str] | None = None) -> dict[str, int]:
    """Give back the holds of dead instances and the expired holds of live ones (sync
    client). Returns {"instances": dead instances seen, "holds": holds returned,
    "micro": micro-dollars taken off reserved counters}."""
    now = time.time() if now is None else now
    if instances is None:
        instances = [_text(i) for i in redis.smembers(keys.gateway_instances())]
    out = {"instances": 0, "holds": 0, "micro": 0}
    for inst in instances:
        alive_key, holds_key = keys.gateway_alive(inst), keys.budget_holds(inst)
        held = redis.hgetall(holds_key)
        alive = bool(redis.exists(alive_key))
        if alive:
            held = {f: v for f, v in held.items() if _expired(v, now)}
            if not held:
                continue
        else:
            out["instances"] += 1
        fields, counters = _plan(held)
        n, micro = redis.eval(_REAP, 3 + len(counters), alive_key, holds_key,
                              keys.gateway_instances(), *counters, now, inst, *fields)
        out["holds"] += int(n)
        out["micro"] += int(micro)
    return out


def _expired(value: Any, now: float) -> bool:
    try:
        return int(_text(value).rsplit("|", 1)[1]) < now
    except (IndexError, ValueError):
        return True


def live_holds(redis, keys: Keys) -> dict[str, int]:
    """reserved-counter key -> micro-dollars held by every instance's holds (the other
    side of the invariant ``reserved == sum of live holds``; tests and the soak read it)."""
    out: dict[str, int] = {}
    for inst in redis.smembers(keys.gateway_instances()):
        for value in redis.hvals(keys.budget_holds(_text(inst))):
            key, micro, _deadline = _text(value).rsplit("|", 2)
            out[key] = out.get(key, 0) + int(micro)
    return out
