"""Live replica load for bounded-load replica choice, kept in Redis by the gateways.

Layout (``<ns>`` is the Redis namespace):

- ``<ns>:replica:<id>:inflight``  hash, field = gateway process id, value = that process's
  in-flight requests on the replica. Only the owning process writes its field, and it
  writes the absolute count it holds locally, so a lost write heals on the next one.
- ``<ns>:replica:<id>:inflight_seen``  hash, same fields, value = unix time of the
  owner's last write. Readers ignore a field not refreshed within ``ttl_s``: a crashed
  gateway stops refreshing, so its load disappears after at most ``ttl_s``. Both keys
  also expire (2 x ``ttl_s``) when nobody writes them.
- ``<ns>:replica:<id>:stats``  hash written by the pool's metrics scraper; this module
  reads its ``num_requests_waiting`` field.
- the inflight hash's field ``p:<gateway id>``: the prompt tokens that process sent the
  replica unmatched by the KV index (S03 ``kv_events``) on streamed requests whose first
  token has not come yet, the prefill the replica still has to do. Written with the count
  (a first token only lowers the process's own figure, which its next write on the
  replica, or the refresh, carries: no round trip of its own) and read through the same
  seen time; the load's sum skips these fields, which have no seen time of their own.

Load of a replica = live in-flight (all gateways) + scraped ``num_requests_waiting``.
A request queued inside the engine thus counts twice: a replica that has started to queue
looks heavier than one that is merely busy, and traffic that bypasses the gateways
(batch jobs, other routers) still shows.

``InflightTracker`` (sync) and ``AsyncInflightTracker`` (redis.asyncio, for the Starlette
gateway) share the command builders below. A read is one script call that sums the loads in
Redis (``LOAD_LUA``) and returns one number per replica: S03 reads loads on every request,
and parsing three hashes per replica in Python cost the gateway more than the choice itself.
S03 ``kv_events`` reads the loads in the same call as the KV-block index
(``app.contract.kv_index.read_route_inputs``).
"""
from __future__ import annotations

import functools
import hashlib
import hmac
import os
import socket
import time
import uuid
from collections import Counter
from contextlib import asynccontextmanager, contextmanager
from typing import Any, Hashable, Iterable, Mapping

from redis.exceptions import NoScriptError

from app.contract.aredis import Head, head, lane_of, packed, packs_heads
from app.contract.keys import Keys

DEFAULT_TTL_S = 30


def _keys(ns: Keys | str) -> Keys:
    return ns if isinstance(ns, Keys) else Keys(ns)


def gateway_process_id() -> str:
    """Unique per process start: host, pid and a random suffix (pids get reused)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


# A Lua function: the load of one replica from its inflight and inflight_seen hashes and its
# stats hash at (now, ttl); the same rule as the Python readers had: a gateway's count
# counts while its seen time is within ttl, plus the scraped queue, each floored at 0. Its
# second value is the live gateways' pending prefill (``p:<gateway id>`` fields).
LOAD_LUA = """
local function replica_load(inflight, seen, stats, now, ttl)
  local live, pend = 0, 0
  local counts = redis.call('HGETALL', inflight)
  if #counts > 0 then
    local raw = redis.call('HGETALL', seen)
    local at = {}
    for j = 1, #raw, 2 do at[raw[j]] = tonumber(raw[j + 1]) end
    for j = 1, #counts, 2 do
      local f = counts[j]
      local t = at[f]
      if t then
        if now - t <= ttl then live = live + (tonumber(counts[j + 1]) or 0) end
      elseif string.sub(f, 1, 2) == 'p:' then
        t = at[string.sub(f, 3)]
        if t and now - t <= ttl then pend = pend + (tonumber(counts[j + 1]) or 0) end
      end
    end
  end
  if live < 0 then live = 0 end
  if pend < 0 then pend = 0 end
  local waiting = tonumber(redis.call('HGET', stats, 'num_requests_waiting')) or 0
  if waiting < 0 then waiting = 0 end
  return live + waiting, pend
end
"""
# KEYS: (inflight, inflight_seen, stats) per replica; ARGV: ttl, now (the fixed argument
# first: ``Lua.acall`` packs it once with the keys). Loads as strings (a Lua number would
# come back truncated to an integer).
_LOADS_LUA = LOAD_LUA + """
local out = {}
local ttl, now = tonumber(ARGV[1]), tonumber(ARGV[2])
for i = 1, #KEYS / 3 do
  out[i] = tostring(replica_load(KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i], now, ttl))
end
return out
"""
class Lua:
    """A Lua script run by its sha1 (EVALSHA: the text is not resent per call), loaded
    again when Redis lost it (a restart, SCRIPT FLUSH). Holds no client, so one module-level
    instance serves every client, sync or asyncio."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.sha = hashlib.sha1(text.encode()).hexdigest()

    def __call__(self, redis, keys: list, args: list):
        try:
            return redis.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            return redis.eval(self.text, len(keys), *keys, *args)

    async def acall(self, redis, keys: list, args: list, fixed: int = 0):
        """The script on an asyncio client. ``fixed``: how many leading ``args`` are the
        same on every call with these ``keys``; on the gateway's client (``app.contract.
        aredis``) they are packed once with the keys, so a call packs only the rest, and
        it goes by the client's pipelined lane (``app.contract.redis_lane``)."""
        n = len(keys)
        if fixed and packs_heads(redis):
            cmd = ("EVALSHA", head(("EVALSHA", self.sha, n, *keys, *args[:fixed])),
                   *args[fixed:])
        else:
            cmd = ("EVALSHA", self.sha, n, *keys, *args)
        lane = lane_of(redis)
        try:
            if lane is not None:
                return await lane.execute(packed(cmd))
            if cmd[1].__class__ is Head:
                return await redis.execute_command(*cmd)
            return await redis.evalsha(self.sha, n, *keys, *args)   # any client with evalsha
        except NoScriptError:
            if lane is not None:
                return await lane.execute(packed(("EVAL", self.text, n, *keys, *args)))
            return await redis.eval(self.text, n, *keys, *args)


_LOADS = Lua(_LOADS_LUA)
# The same keys and arguments; per replica its load (a string) and its pending prefill.
_LOADS_PENDING = Lua(LOAD_LUA + """
local out = {}
local ttl, now = tonumber(ARGV[1]), tonumber(ARGV[2])
for i = 1, #KEYS / 3 do
  local load, pend = replica_load(KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i], now, ttl)
  out[2 * i - 1], out[2 * i] = tostring(load), pend
end
return out
""")


def load_keys(k: Keys, replica_ids: Iterable[Hashable]) -> list[str]:
    """``LOAD_LUA``'s three keys per replica, in order."""
    names: list[str] = []
    for rid in replica_ids:
        names += [k.replica_inflight(rid), k.replica_inflight_seen(rid), k.replica_stats(rid)]
    return names


def parse_load(raw: Any) -> float:
    return float(raw)        # bytes, str or a number: float() reads each as it is


def script_keys(memo: dict, keys: Keys, replica_ids, build) -> list[str]:
    """A script's KEYS for these replicas, ``build(keys, replica_ids)`` once per
    (namespace, replica ids) in ``memo`` (S03 reads them on every request; formatting the
    names each time cost more than the rest of the call's arguments)."""
    at = (keys.ns, tuple(replica_ids))
    names = memo.get(at)
    if names is None:
        names = build(keys, replica_ids)
        if len(memo) >= 1024:
            memo.clear()
        memo[at] = names
    return names


_LOAD_NAMES: dict[tuple, list[str]] = {}


def _loads_call(ids: list, ns: Keys | str, ttl_s: int, now: float | None) -> tuple[list, list]:
    return (script_keys(_LOAD_NAMES, _keys(ns), ids, load_keys),
            [ttl_s, repr(time.time() if now is None else now)])


def read_loads(redis, replica_ids: Iterable[Hashable], ns: Keys | str, *,
               ttl_s: int = DEFAULT_TTL_S, now: float | None = None) -> dict[Hashable, float]:
    """``{replica_id: load}`` for ``pick_replica``, in one round trip."""
    ids = list(replica_ids)
    if not ids:
        return {}
    got = _LOADS(redis, *_loads_call(ids, ns, ttl_s, now))
    return {rid: parse_load(v) for rid, v in zip(ids, got)}


async def read_loads_async(redis, replica_ids: Iterable[Hashable], ns: Keys | str, *,
                           ttl_s: int = DEFAULT_TTL_S,
                           now: float | None = None) -> dict[Hashable, float]:
    """``read_loads`` on a ``redis.asyncio`` client."""
    ids = list(replica_ids)
    if not ids:
        return {}
    got = await _LOADS.acall(redis, *_loads_call(ids, ns, ttl_s, now), fixed=1)
    return {rid: parse_load(v) for rid, v in zip(ids, got)}


def read_loads_pending(redis, replica_ids: Iterable[Hashable], ns: Keys | str, *,
                       ttl_s: int = DEFAULT_TTL_S, now: float | None = None
                       ) -> tuple[dict[Hashable, float], dict[Hashable, int]]:
    """(``read_loads``, ``{replica_id: prompt tokens awaiting prefill}`` from the live
    gateways) in one round trip, by ``LOAD_LUA`` as S03 kv_events reads them (the Routing
    page)."""
    ids = list(replica_ids)
    if not ids:
        return {}, {}
    got = _LOADS_PENDING(redis, *_loads_call(ids, ns, ttl_s, now))
    return ({rid: parse_load(got[2 * i]) for i, rid in enumerate(ids)},
            {rid: int(got[2 * i + 1]) for i, rid in enumerate(ids)})


# One replica's count for this gateway in one call (acquire and release run it per proxied
# request: a 4-command pipeline cost the gateway about three times the CPU of one EVALSHA).
# KEYS: inflight, inflight_seen; ARGV: gateway id, count, now, expiry (s), pending prompt
# tokens. A count of 0 removes the gateway's fields; a pending of 0 its pending one.
_BUMP_LUA = """
local pend = 'p:' .. ARGV[1]
if tonumber(ARGV[2]) <= 0 then
  redis.call('HDEL', KEYS[1], ARGV[1], pend)
  redis.call('HDEL', KEYS[2], ARGV[1])
else
  if tonumber(ARGV[5]) > 0 then
    redis.call('HSET', KEYS[1], ARGV[1], ARGV[2], pend, ARGV[5])
  else
    redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
    redis.call('HDEL', KEYS[1], pend)
  end
  redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
  redis.call('EXPIRE', KEYS[1], ARGV[4])
  redis.call('EXPIRE', KEYS[2], ARGV[4])
end
return 1
"""
_BUMP = Lua(_BUMP_LUA)


class _TrackerBase:
    def __init__(self, redis, ns: Keys | str, *, gateway_id: str | None = None,
                 ttl_s: int = DEFAULT_TTL_S) -> None:
        self.redis = redis
        self.k = _keys(ns)
        self.gateway_id = gateway_id or gateway_process_id()
        self.ttl_s = ttl_s
        self.local: Counter = Counter()
        self.pending: Counter = Counter()   # prompt tokens awaiting prefill, per replica

    def _write(self, replica_id: Hashable, count: int) -> tuple[list, list]:
        """``_BUMP``'s (keys, args): this process's count and pending prefill on
        ``replica_id``, seen now."""
        k = self.k
        return ([k.replica_inflight(replica_id), k.replica_inflight_seen(replica_id)],
                [self.gateway_id, count, f"{time.time():.3f}", 2 * self.ttl_s,
                 self.pending.get(replica_id, 0)])

    def _bump(self, replica_id: Hashable, delta: int, pending: int) -> tuple[list, list]:
        self.local[replica_id] = max(0, self.local[replica_id] + delta)
        count = self.local[replica_id]
        if count == 0:                 # nothing in flight: nothing awaits prefill either
            del self.local[replica_id]
            self.pending.pop(replica_id, None)
        elif pending:
            self._pend(replica_id, pending if delta > 0 else -pending)
        return self._write(replica_id, count)

    def _pend(self, replica_id: Hashable, delta: int) -> None:
        left = self.pending[replica_id] + delta
        if left > 0:
            self.pending[replica_id] = left
        else:
            self.pending.pop(replica_id, None)

    def prefilled(self, replica_id: Hashable, pending: int) -> None:
        """A request's first token came: the ``pending`` prompt tokens it was acquired with
        are prefilled. Only this process's figure changes here; its next write on the
        replica (an acquire, a release, the refresh) carries it."""
        if pending:
            self._pend(replica_id, -pending)

    def _live(self) -> list[tuple[list, list]]:
        """What ``refresh`` writes: every count this process holds, seen now."""
        return [self._write(rid, count) for rid, count in list(self.local.items())]


class InflightTracker(_TrackerBase):
    """This gateway process's in-flight counts. Call ``refresh()`` every ``ttl_s / 3``
    seconds while requests are in flight, or the load expires for readers."""

    def acquire(self, replica_id: Hashable, pending: int = 0) -> None:
        """One more request in flight on the replica, with ``pending`` prompt tokens it
        has still to prefill (0 when not known or not streamed)."""
        _BUMP(self.redis, *self._bump(replica_id, +1, pending))

    def release(self, replica_id: Hashable, pending: int = 0) -> None:
        """The request is done; ``pending``: what it still counted (its tokens when no
        first token came, else 0)."""
        _BUMP(self.redis, *self._bump(replica_id, -1, pending))

    def refresh(self) -> None:
        for write in self._live():
            _BUMP(self.redis, *write)

    @contextmanager
    def track(self, replica_id: Hashable):
        self.acquire(replica_id)
        try:
            yield
        finally:
            self.release(replica_id)


class AsyncInflightTracker(_TrackerBase):
    """``InflightTracker`` on ``redis.asyncio``, for the Starlette gateway."""

    async def acquire(self, replica_id: Hashable, pending: int = 0) -> None:
        await _BUMP.acall(self.redis, *self._bump(replica_id, +1, pending))

    async def release(self, replica_id: Hashable, pending: int = 0) -> None:
        await _BUMP.acall(self.redis, *self._bump(replica_id, -1, pending))

    async def refresh(self) -> None:
        for write in self._live():
            await _BUMP.acall(self.redis, *write)

    @asynccontextmanager
    async def track(self, replica_id: Hashable):
        await self.acquire(replica_id)
        try:
            yield
        finally:
            await self.release(replica_id)


@functools.lru_cache(maxsize=4096)
def cache_salt(tenant_id: int | str, secret: str | bytes) -> str:
    """The tenant's engine ``cache_salt``: HMAC-SHA256 of the tenant id under ``secret``,
    so it is stable across gateways and restarts but not guessable from the tenant id.
    Kept per (tenant, secret): the gateway asks for it two or three times a request (the
    routing key, S03 kv_events' block chain, the upstream body), 1.5 us each as an HMAC."""
    key = secret.encode() if isinstance(secret, str) else secret
    return hmac.new(key, f"sluice-cache-salt:{tenant_id}".encode(), hashlib.sha256).hexdigest()[:32]


def cache_salt_for(policy: Mapping[str, Any], tenant_id: int | str,
                   secret: str | bytes) -> str | None:
    """``cache_salt`` when the tenant's effective policy asks for isolation, else None."""
    return cache_salt(tenant_id, secret) if policy["cache_salt"] else None
