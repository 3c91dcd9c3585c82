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

from app.contract.keys import Keys
from app.core.kv_keys import KVEvent

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
        return (h & (2**64 - 1)).to_bytes(8, "big")
    return bytes(h[:8])


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


# One round trip, a few bytes back: per replica (state key, blocks key) in KEYS, the cutoff
# time then the request's block ids in ARGV; returns per replica the number of leading
# blocks it holds, or -1 when its subscriber has not been heard since the cutoff.
_MATCH_LUA = """
local out = {}
local cutoff = tonumber(ARGV[1])
for i = 1, #KEYS / 2 do
  local seen = redis.call('HGET', KEYS[2 * i - 1], 'seen')
  if not seen or tonumber(seen) < cutoff then
    out[i] = -1
  else
    local c = 0
    for j = 2, #ARGV do
      if redis.call('SISMEMBER', KEYS[2 * i], ARGV[j]) == 1 then c = c + 1 else break end
    end
    out[i] = c
  end
end
return out
"""
_scripts: dict[int, tuple[Any, Any]] = {}


def _script(redis):
    got = _scripts.get(id(redis))
    if got is None or got[0] is not redis:
        got = _scripts[id(redis)] = (redis, redis.register_script(_MATCH_LUA))
    return got[1]


def _match_args(keys: Keys, replica_ids, chain, stale_s: float) -> tuple[list, list]:
    names = []
    for rid in replica_ids:
        names += [keys.replica_kv_state(rid), keys.replica_kv_blocks(rid)]
    return names, [time.time() - stale_s, *(block_id(h) for h in chain)]


def _parse_matched(replica_ids, counts, block_tokens: int) -> dict | None:
    matched = {rid: float(int(n) * block_tokens) for rid, n in zip(replica_ids, counts)
               if int(n) > 0}
    return matched if any(int(n) >= 0 for n in counts) else None


def read_matched(redis, keys: Keys, replica_ids: Sequence[object], chain: Sequence[bytes],
                 block_tokens: int, *, stale_s: float = STALE_S) -> dict | None:
    """Matched leading prompt tokens per replica for a request's block-hash ``chain``;
    None when no replica's index is fresh (the caller falls back to rendezvous)."""
    names, args = _match_args(keys, replica_ids, chain, stale_s)
    return _parse_matched(replica_ids, _script(redis)(keys=names, args=args), block_tokens)


async def read_matched_async(redis, keys: Keys, replica_ids: Sequence[object],
                             chain: Sequence[bytes], block_tokens: int, *,
                             stale_s: float = STALE_S) -> dict | None:
    """``read_matched`` on an asyncio Redis client (the gateway's)."""
    names, args = _match_args(keys, replica_ids, chain, stale_s)
    counts = await _script(redis)(keys=names, args=args)
    return _parse_matched(replica_ids, counts, block_tokens)


async def count_routed(redis, keys: Keys, tallies: Mapping[object, Sequence[int]]) -> None:
    """The gateway's tally of what the index promised for the requests it sent: per replica
    (requests, matched prompt tokens, prompt tokens), added to its state hash (the Routing
    page's matched share); it lives as long as the replica's index entry does."""
    pipe = redis.pipeline(transaction=False)
    for replica_id, (routed, matched, prompt) in tallies.items():
        state = keys.replica_kv_state(replica_id)
        pipe.hincrby(state, "routed", int(routed))
        pipe.hincrby(state, "routed_matched", int(matched))
        pipe.hincrby(state, "routed_prompt", int(prompt))
        pipe.expire(state, TTL_S)
    await pipe.execute()


async def read_routed_async(redis, keys: Keys,
                            replica_ids: Sequence[object]) -> dict[object, float]:
    """Requests the gateways sent to each replica while its index entry lived (the tally
    ``count_routed`` adds, flushed about once a second per process): the balance
    ``kv_choice`` bounds. One pipeline round trip."""
    pipe = redis.pipeline(transaction=False)
    for rid in replica_ids:
        pipe.hget(keys.replica_kv_state(rid), "routed")
    replies = await pipe.execute()
    return {rid: float(int(v or 0)) for rid, v in zip(replica_ids, replies)}


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
