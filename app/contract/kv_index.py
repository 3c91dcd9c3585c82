"""The KV-block index in Redis: which blocks each replica holds, from its own KV events.

The subscriber (``workers.pools.kv_subscriber``) decodes each replica's ``EventBatch``es
here and turns them into index keys with ``app.core.kv_keys.BlockKeys``: our own
chained sha256 over the token ids the events carry (cache salt and LoRA in the chain), not
the engine's block hashes, which no other process can compute (vLLM seeds them per
process). Every gateway process and host hashes a prompt the same way and reads the same
sets, so they make the same choice (``app.core.kv_routing.kv_choice``). Per replica: a set
of index keys (8 bytes each) and a state hash (last seq, when the last event or heartbeat
was seen, resyncs, blocks that could not be placed). Both expire ``ttl_s`` after the
subscriber's last heartbeat, so a replica whose subscriber stops, or that dies, drops out
of the index.
"""
from __future__ import annotations

import time
from typing import Any, Iterable, Mapping, Sequence

import msgspec

from app.contract.inflight import DEFAULT_TTL_S as LOAD_TTL_S
from app.contract.inflight import LOAD_LUA, Lua, load_keys, parse_load, script_keys
from app.contract.keys import Keys
from app.core.kv_keys import ID_BYTES, KVEvent

TTL_S = 30            # index entries of a replica live this long past the last heartbeat
STALE_S = 10.0        # a replica whose subscriber said nothing for this long is not read
# vLLM's field order, for the positional (array_like) events of vLLM before its map
# encoding (vllm-project/vllm#42892); each field was appended in its time, so an older
# event is a prefix of this
_FIELDS = {"BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size",
                           "lora_id", "medium", "lora_name", "extra_keys", "group_idx",
                           "kv_cache_spec_kind", "kv_cache_spec_sliding_window"),
           "BlockRemoved": ("block_hashes", "medium", "group_idx"), "AllBlocksCleared": ()}


def block_id(h: bytes | int) -> bytes:
    """The index's name of a key: its first 8 bytes."""
    if isinstance(h, int):
        return (h & (2**(8 * ID_BYTES) - 1)).to_bytes(ID_BYTES, "big")
    return bytes(h[:ID_BYTES])


def _hash(h: Any) -> Any:
    """An engine block hash as a dict key (vLLM sends 64-bit ints by default, bytes with
    VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0)."""
    return bytes(h) if isinstance(h, (bytes, bytearray, memoryview)) else h


def decode_batch(payload: bytes) -> list[KVEvent]:
    """vLLM's msgpack ``EventBatch`` -> its events. The batch may be an array
    ``[ts, events, data_parallel_rank?]`` or a map; each event a tagged array (vLLM before
    #42892, fields by position) or a map tagged by ``type`` (later vLLM, and the
    reference engine)."""
    raw = msgspec.msgpack.decode(payload)
    if isinstance(raw, dict):
        events = raw.get("events")
    elif isinstance(raw, list) and len(raw) >= 2:
        events = raw[1]
    else:
        events = None
    if not isinstance(events, list):
        raise ValueError("not an EventBatch")
    out = []
    for ev in events:
        if isinstance(ev, dict):
            tag, fields = ev.get("type"), ev
        elif isinstance(ev, list) and ev and isinstance(ev[0], str):
            tag = ev[0]
            fields = dict(zip(_FIELDS.get(tag, ()), ev[1:]))
        else:
            raise ValueError("a KV event must be a tagged array or map")
        if tag not in _FIELDS:
            raise ValueError(f"unknown KV event {tag!r}")
        parent = fields.get("parent_block_hash")
        out.append(KVEvent(
            tag, tuple(_hash(h) for h in fields.get("block_hashes") or ()),
            None if parent is None else _hash(parent), fields.get("token_ids") or (),
            fields.get("block_size"), fields.get("lora_id"), fields.get("lora_name"),
            fields.get("medium"), fields.get("extra_keys"), fields.get("group_idx"),
            fields.get("kv_cache_spec_kind")))
    return out


def apply_events(redis, keys: Keys, replica_id: object, events: Sequence[tuple[str, list]],
                 seq: int, *, ttl_s: int = TTL_S, orphans: int = 0) -> None:
    """One batch's index changes (``BlockKeys.apply``: ``(kind, index keys)`` in order),
    the replica's last seq and the blocks it could not place, in one round trip."""
    blocks = keys.replica_kv_blocks(replica_id)
    pipe = redis.pipeline(transaction=True)
    stored = removed = 0
    for kind, hashes in events:
        ids = [block_id(h) for h in hashes]
        if kind == "AllBlocksCleared":
            pipe.delete(blocks)
        elif kind == "BlockStored" and ids:
            pipe.sadd(blocks, *ids)
            stored += len(ids)
        elif kind == "BlockRemoved" and ids:
            pipe.srem(blocks, *ids)
            removed += len(ids)
    state = keys.replica_kv_state(replica_id)
    pipe.hset(state, mapping={"seq": seq, "seen": time.time()})
    pipe.hincrby(state, "stored", stored)
    pipe.hincrby(state, "removed", removed)
    if orphans:
        pipe.hincrby(state, "orphans", orphans)
    pipe.expire(blocks, ttl_s)
    pipe.expire(state, ttl_s)
    pipe.execute()


def heartbeat(redis, keys: Keys, replica_ids: Iterable[object], *, ttl_s: int = TTL_S) -> None:
    """The subscriber is alive and connected: keep the replicas' entries."""
    pipe = redis.pipeline(transaction=False)
    now = time.time()
    for rid in replica_ids:
        pipe.hset(keys.replica_kv_state(rid), "seen", now)
        pipe.expire(keys.replica_kv_state(rid), ttl_s)
        pipe.expire(keys.replica_kv_blocks(rid), ttl_s)
    pipe.execute()


def forget(redis, keys: Keys, replica_id: object, *, resync: bool = False) -> None:
    """Drop what the index holds of a replica (it died, restarted, or a gap could not be
    replayed: its blocks come back with its next stored events)."""
    pipe = redis.pipeline(transaction=True)
    pipe.delete(keys.replica_kv_blocks(replica_id))
    if resync:
        pipe.hincrby(keys.replica_kv_state(replica_id), "resyncs", 1)
    else:
        pipe.delete(keys.replica_kv_state(replica_id))
    pipe.execute()


# S03 kv_events' one round trip: per replica, KEYS holds (inflight, inflight_seen,
# stats, kv state, kv blocks); ARGV: the loads' ttl, the seconds after which a replica's
# index is stale, the state hashes' ttl (the fixed arguments first: ``Lua.acall`` packs
# them once with the keys), now, the request's block ids (8 bytes each) joined in one
# string, then the gateway's tally of its earlier choices not yet written, one string of
# "replica's place in KEYS /5, requests, matched prompt tokens, prompt tokens" per replica,
# space-separated (one argument: each argument cost the gateway ~6k instructions to send,
# a number in a string ~0.1k; matched and prompt tokens may be 0 0, written later). The
# tally is added to the requests sent that the script returns per replica (with its load, a
# string, ``LOAD_LUA``, the number of leading blocks it holds, -1 when its subscriber has
# not been heard since the cutoff, and the prompt tokens the live gateways sent it that
# await their first token, ``LOAD_LUA``'s second value), so they include every choice this
# gateway made before this one.
# The requests sent count from a base (``sent_base``) set when the script first sees the
# replica: 0 for every replica of a new set, the mean of the others for one that joins
# it (its state hash is then given the state ttl; an entry that has a base has it from
# that or from the subscriber, and HINCRBY keeps it: no EXPIRE per request).
# Counted in Redis (bench/route_script_cost.py): ~180k instructions a call with the usual
# one-row tally, the loads script 81k; the tally's EXPIRE and token counts per request
# were ~15k of it.
_ROUTE_LUA = LOAD_LUA + """
local out = {}
local members = nil
local ttl, now = tonumber(ARGV[1]), tonumber(ARGV[4])
local cutoff = now - tonumber(ARGV[2])
local state_ttl = tonumber(ARGV[3])
local chain = ARGV[5]
local blocks = #chain / 8
local first = string.sub(chain, 1, 8)
local tally = {}
if ARGV[6] then
  for i, sent, matched, prompt in string.gmatch(ARGV[6], '(%d+) (%d+) (%d+) (%d+)') do
    tally[tonumber(i)] = {sent, matched, prompt}
  end
end
local function add(state, row)
  redis.call('HINCRBY', state, 'routed', row[1])
  if row[3] ~= '0' then
    redis.call('HINCRBY', state, 'routed_matched', row[2])
    redis.call('HINCRBY', state, 'routed_prompt', row[3])
  end
end
local joined, known_sum, known_n = {}, 0, 0
for i = 1, #KEYS / 5 do
  local b = 5 * (i - 1)
  local load, pend = replica_load(KEYS[b + 1], KEYS[b + 2], KEYS[b + 3], now, ttl)
  out[4 * i - 3] = tostring(load)
  out[4 * i] = pend
  local state = redis.call('HMGET', KEYS[b + 4], 'seen', 'routed', 'sent_base')
  local seen = tonumber(state[1])
  local c = -1
  if seen and seen >= cutoff then
    c = 0
    -- the first block first: a replica without it matches nothing (one call, as an
    -- EXISTS was, and a replica whose cache holds other prompts stops here too)
    if blocks > 0 and redis.call('SISMEMBER', KEYS[b + 5], first) == 1 then
      c = 1
      if not members then
        members = {}
        for j = 1, blocks do members[j] = string.sub(chain, 8 * j - 7, 8 * j) end
      end
      -- the rest by SMISMEMBER (Redis 6.2) in runs of 256: a call per run instead of one
      -- per block, and unpack stays far below Lua's stack limit on a long prompt
      for s = 2, blocks, 256 do
        local e = math.min(s + 255, blocks)
        local held = redis.call('SMISMEMBER', KEYS[b + 5], unpack(members, s, e))
        local run = 0
        for j = 1, e - s + 1 do
          if held[j] == 1 then run = run + 1 else break end
        end
        c = c + run
        if run < e - s + 1 then break end
      end
    end
  end
  out[4 * i - 2] = c
  local sent = tonumber(state[2]) or 0
  local row = tally[i]
  if row then sent = sent + tonumber(row[1]) end
  local base = tonumber(state[3])
  if base then
    if row then add(KEYS[b + 4], row) end
    out[4 * i - 1] = sent + base
    known_sum, known_n = known_sum + out[4 * i - 1], known_n + 1
  else
    out[4 * i - 1] = sent
    joined[#joined + 1] = i
  end
end
-- a replica that joined the set (a new replica, or one whose entry went with its death or
-- restart) starts at the mean of the others, so the bound asks for balance from now on and
-- does not send it everything until it has caught up on the others' past
local mean = 0
if known_n > 0 then mean = math.floor(known_sum / known_n) end
for _, i in ipairs(joined) do
  local state = KEYS[5 * i - 1]
  if tally[i] then add(state, tally[i]) end
  redis.call('HSET', state, 'sent_base', mean)
  redis.call('EXPIRE', state, state_ttl)
  out[4 * i - 1] = out[4 * i - 1] + mean
end
return out
"""


_ROUTE = Lua(_ROUTE_LUA)


_ROUTE_NAMES: dict[tuple, list[str]] = {}


def _route_keys(keys: Keys, replica_ids) -> list[str]:
    names: list[str] = []
    for rid in replica_ids:
        names += load_keys(keys, [rid])
        names += [keys.replica_kv_state(rid), keys.replica_kv_blocks(rid)]
    return names


def _route_call(keys: Keys, replica_ids, chain, stale_s: float, load_ttl_s: int,
                tally: Mapping[object, Sequence[int]] | None = None) -> tuple[list, list]:
    names = script_keys(_ROUTE_NAMES, keys, replica_ids, _route_keys)
    now = time.time()
    # the gateway's are its keys' index names joined already (kv_route.request_ids)
    blob = chain if chain.__class__ is bytes else b"".join([block_id(h) for h in chain])
    args = [load_ttl_s, stale_s, TTL_S, repr(now), blob]
    if tally:
        rows = ""
        for i, rid in enumerate(replica_ids, 1):
            row = tally.get(rid)
            if row is not None:
                rows += f"{i} {int(row[0])} {int(row[1])} {int(row[2])} "
        if rows:
            args.append(rows)
    return names, args


def _parse_route(replica_ids, got, block_tokens: int
                 ) -> tuple[dict, dict | None, dict, dict]:
    # per request on the gateway's event loop: the script's integers come back as ints and
    # float() reads the load's bytes as they are
    loads, matched, routed, pending, fresh = {}, {}, {}, {}, False
    j = 0
    for rid in replica_ids:
        loads[rid] = float(got[j])
        n = got[j + 1]
        if n >= 0:
            fresh = True
            if n:
                matched[rid] = float(n * block_tokens)
        routed[rid] = float(got[j + 2])
        if got[j + 3]:
            pending[rid] = float(got[j + 3])
        j += 4
    return loads, (matched if fresh else None), routed, pending


def read_route_inputs(redis, keys: Keys, replica_ids: Sequence[object],
                      chain: bytes | Sequence[bytes], block_tokens: int, *,
                      stale_s: float = STALE_S, load_ttl_s: int = LOAD_TTL_S,
                      tally: Mapping[object, Sequence[int]] | None = None
                      ) -> tuple[dict, dict | None, dict, dict]:
    """What ``kv_choice`` weighs, in one round trip: (loads as
    ``app.contract.inflight.read_loads`` gives them, matched leading prompt tokens per
    replica for the request's block-hash ``chain`` (the keys, or their index names joined
    as ``app.gateway.kv_route.request_ids`` gives them) or None when no replica's index is
    fresh (the caller falls back to rendezvous), requests the gateways sent each replica
    while its index entry lived, prompt tokens awaiting prefill per replica, only those
    above 0). ``tally``: the caller's choices not yet counted, per
    replica of ``replica_ids`` (requests, matched prompt tokens, prompt tokens), added to
    the replicas' state hashes (the bound on requests sent, the Routing page's matched
    share) before they are read; entries for other replicas are left out."""
    got = _ROUTE(redis, *_route_call(keys, replica_ids, chain, stale_s, load_ttl_s, tally))
    return _parse_route(replica_ids, got, block_tokens)


async def read_route_inputs_async(redis, keys: Keys, replica_ids: Sequence[object],
                                  chain: bytes | Sequence[bytes], block_tokens: int, *,
                                  stale_s: float = STALE_S, load_ttl_s: int = LOAD_TTL_S,
                                  tally: Mapping[object, Sequence[int]] | None = None
                                  ) -> tuple[dict, dict | None, dict, dict]:
    """``read_route_inputs`` on an asyncio Redis client (the gateway's)."""
    got = await _ROUTE.acall(redis, *_route_call(keys, replica_ids, chain, stale_s,
                                                 load_ttl_s, tally), fixed=3)
    return _parse_route(replica_ids, got, block_tokens)


def read_matched(redis, keys: Keys, replica_ids: Sequence[object], chain: Sequence[bytes],
                 block_tokens: int, *, stale_s: float = STALE_S) -> dict | None:
    """Matched leading prompt tokens per replica for a request's block-hash ``chain``;
    None when no replica's index is fresh."""
    return read_route_inputs(redis, keys, replica_ids, chain, block_tokens,
                             stale_s=stale_s)[1]


def freshness(redis, keys: Keys, replica_ids: Sequence[object]) -> dict[object, dict]:
    """Per replica: seconds since the subscriber last heard of it, last seq, blocks held,
    resyncs, stored/removed counts, blocks not placed (the Routing page)."""
    pipe = redis.pipeline(transaction=False)
    for rid in replica_ids:
        pipe.hgetall(keys.replica_kv_state(rid))
        pipe.scard(keys.replica_kv_blocks(rid))
    replies = pipe.execute()
    now = time.time()
    out: dict[object, dict] = {}
    for i, rid in enumerate(replica_ids):
        state: Mapping = {(k.decode() if isinstance(k, bytes) else k):
                          (v.decode() if isinstance(v, bytes) else v)
                          for k, v in (replies[2 * i] or {}).items()}
        out[rid] = {"age_s": round(now - float(state["seen"]), 1) if "seen" in state else None,
                    "seq": int(state["seq"]) if "seq" in state else None,
                    "blocks": int(replies[2 * i + 1] or 0),
                    "resyncs": int(state.get("resyncs", 0)),
                    "stored": int(state.get("stored", 0)),
                    "removed": int(state.get("removed", 0)),
                    "orphans": int(state.get("orphans", 0)),
                    "routed": int(state.get("routed", 0)),
                    "matched_share": (int(state["routed_matched"]) / int(state["routed_prompt"])
                                      if int(state.get("routed_prompt", 0) or 0) else None)}
    return out
