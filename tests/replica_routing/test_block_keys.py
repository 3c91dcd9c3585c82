"""BlockKeys (app.core.kv_keys): an engine's KV events -> the index's own keys, on plain
data. The engine hashes here are made the way vLLM makes them (sha256 over a pickle of
(parent, token ids, extra keys) from a random per-process NONE_HASH, published as the low
64 bits), so nothing outside the "engine" could compute them; the keys must still equal
the chain the gateway computes from the prompt's token ids."""
from __future__ import annotations

import hashlib
import os
import pickle

from app.core.kv_keys import (KEY_TOKENS, BlockKeys, ChainCache, KVEvent,
                              block_hash_chain, key_namespace)

TOKENS = list(range(1000, 1096))            # 96 tokens: 6 keys of 16


class FakeVllm:
    """vLLM's hash_block_tokens + BlockStored of one engine process."""

    def __init__(self, block_size: int = 16) -> None:
        self.none_hash = os.urandom(32)
        self.block_size = block_size

    def hashes(self, tokens, lora=None, salt=None, extra=None) -> tuple[list[int], list]:
        parent, out, keys = self.none_hash, [], []
        for start in range(0, len(tokens) // self.block_size * self.block_size,
                           self.block_size):
            k = ([lora] if lora else []) + (extra or []) + (
                [salt] if start == 0 and salt else [])
            k = tuple(k) or None
            parent = hashlib.sha256(pickle.dumps(
                (parent, tuple(tokens[start:start + self.block_size]), k))).digest()
            out.append(int.from_bytes(parent, "big") & (2**64 - 1))
            keys.append(k)
        return out, keys

    def stored(self, tokens, start_block: int, end_block: int, lora=None, salt=None,
               extra=None, **fields) -> KVEvent:
        hashes, keys = self.hashes(tokens, lora, salt, extra)
        b = self.block_size
        return KVEvent("BlockStored", tuple(hashes[start_block:end_block]),
                       hashes[start_block - 1] if start_block else None,
                       tokens[start_block * b:end_block * b], b, None, lora,
                       fields.get("medium", "GPU"), keys[start_block:end_block],
                       fields.get("group_idx", 0), "full_attention")


def _chain(tokens, adapter=None, salt=""):
    return [d[:8] for d in block_hash_chain(key_namespace(adapter, salt), tokens, KEY_TOKENS)]


def _held(changes, held=None) -> set[bytes]:
    held = set() if held is None else held
    for kind, ids in changes:
        if kind == "AllBlocksCleared":
            held.clear()
        elif kind == "BlockStored":
            held |= set(ids)
        else:
            held -= set(ids)
    return held


def test_runs_chained_through_their_parents_give_the_gateways_keys():
    engine, keys = FakeVllm(), BlockKeys()
    changes = keys.apply([engine.stored(TOKENS, 0, 2), engine.stored(TOKENS, 2, 6)])
    assert _held(changes) == set(_chain(TOKENS)) and len(_chain(TOKENS)) == 6
    # the same prompt in another engine process: other hashes, the same keys
    other = BlockKeys()
    assert _held(other.apply([FakeVllm().stored(TOKENS, 0, 6)])) == set(_chain(TOKENS))
    # a removed block takes its key; a clear takes them all
    hashes, _ = engine.hashes(TOKENS)
    gone = keys.apply([KVEvent("BlockRemoved", (hashes[3],), medium="GPU", group_idx=0)])
    assert gone == [("BlockRemoved", [_chain(TOKENS)[3]])]
    assert keys.apply([KVEvent("AllBlocksCleared")]) == [("AllBlocksCleared", [])]
    assert not keys.live and not keys.holders


def test_any_engine_block_size_gives_16_token_keys():
    for size in (32, 64, 4, 8, 48):
        engine, keys = FakeVllm(size), BlockKeys()
        n = len(TOKENS) // size
        got = _held(keys.apply([engine.stored(TOKENS, 0, n // 2),
                                engine.stored(TOKENS, n // 2, n)]))
        assert got == set(_chain(TOKENS[:n * size])), size


def test_salt_and_lora_from_the_extra_keys_keep_chains_apart():
    engine = FakeVllm()
    a = _held(BlockKeys().apply([engine.stored(TOKENS, 0, 6, salt="tenant-a")]))
    b = _held(BlockKeys().apply([engine.stored(TOKENS, 0, 3, salt="tenant-b"),
                                 engine.stored(TOKENS, 3, 6, salt="tenant-b")]))
    plain = set(_chain(TOKENS))
    assert a == set(_chain(TOKENS, salt="tenant-a")) and b == set(_chain(TOKENS,
                                                                      salt="tenant-b"))
    assert not a & b and not a & plain and not b & plain
    lora = _held(BlockKeys().apply([engine.stored(TOKENS, 0, 6, lora="sql-lora",
                                                  salt="tenant-a")]))
    assert lora == set(_chain(TOKENS, "sql-lora", "tenant-a")) and not lora & a


def test_keys_the_gateway_cannot_reproduce_match_nothing():
    engine = FakeVllm()
    image = [["mm-sha-1", 0]]               # vLLM's (identifier, offset) of an image
    got = _held(BlockKeys().apply([engine.stored(TOKENS, 0, 6, extra=image)]))
    assert len(got) == 6 and not got & set(_chain(TOKENS))


def test_a_block_whose_parent_came_before_is_counted_not_guessed():
    engine, keys = FakeVllm(), BlockKeys()
    assert keys.apply([engine.stored(TOKENS, 2, 4)]) == [] and keys.orphans == 2
    # a gap that could not be replayed: nothing is known held, but a parent seen before
    # it still places its children
    keys.apply([engine.stored(TOKENS, 0, 2)])
    keys.forget_held()
    assert not keys.holders
    assert _held(keys.apply([engine.stored(TOKENS, 2, 6)])) == set(_chain(TOKENS)[2:])


def test_other_mediums_and_kv_cache_groups_are_not_followed():
    engine, keys = FakeVllm(), BlockKeys()
    assert keys.apply([engine.stored(TOKENS, 0, 6, medium="CPU")]) == []
    assert keys.apply([engine.stored(TOKENS, 0, 6, group_idx=1)])    # the first one seen
    assert keys.apply([engine.stored(TOKENS[:32] + [7] * 64, 0, 6, group_idx=0)]) == []


def test_the_chain_cache_reuses_shared_parts_and_gives_the_same_keys():
    from array import array

    def part(ids):
        return array("I", ids).tobytes()
    cache = ChainCache()
    system = part(range(500, 580))                         # 5 blocks of a tenant
    odd = part(range(600, 625))                            # 25 ids: ends mid-block
    turns = [part([k] * n) for k, n in ((1, 20), (2, 40), (3, 33), (4, 7), (5, 16))]
    prompts = [[system, turns[0]], [system, turns[1]], [system, turns[0], turns[2]],
               [odd, turns[3], turns[4]], [odd, turns[3], turns[1]], [turns[4], system],
               [system, turns[1], turns[4]], [], [part([1] * 15)]]
    for ns in ("\x00", key_namespace(None, "tenant-a")):
        for parts in prompts:
            ids = array("I", b"".join(parts)).tolist()
            want = block_hash_chain(ns, ids[:len(ids) // 16 * 16], 16)
            assert cache.chain_parts(ns, parts) == (want, len(ids)), (ns, parts)
            assert cache.chain_ids(ns, parts) == (b"".join(k[:8] for k in want), len(ids))
    # the system prompt was hashed once per namespace; its keys were reused after that
    assert cache.hashed < sum(len(b"".join(p)) // 64 for p in prompts) * 2
    assert cache.reused >= 5 * 4
    # the same prompt again: nothing hashed, and a caller's change to it stays its own
    hashed = cache.hashed
    got, _ = cache.chain_parts("\x00", prompts[2])
    assert cache.hashed == hashed
    got.append(b"x")
    assert cache.chain_parts("\x00", prompts[2])[0] == got[:-1]
    assert cache.chain("\x00", [1] * 15) == []
    assert cache.chain("\x00", list(range(40))) == block_hash_chain("\x00", list(range(32)))


def test_the_chain_cache_stays_within_its_bytes():
    from array import array
    cache = ChainCache(max_bytes=64 * 1024)
    for i in range(500):                                   # 500 prompts of 4 KB each
        parts = [array("I", [i] * 512).tobytes(), array("I", [7] * 500).tobytes()]
        cache.chain_parts("\x00", parts)
        assert cache.bytes <= 64 * 1024
    assert len(cache._made) < 50
    want = block_hash_chain("\x00", [499] * 512 + [7] * 496)
    assert cache.chain_parts("\x00", parts)[0] == want