"""The prefix cache's bookkeeping on plain tensors."""
from __future__ import annotations

import torch

from app.engine.prefix_cache import PrefixCache, block_hashes
from app.engine.sampling import find_stop, safe_emit_length


def _kv(n: int, layers: int = 2) -> list:
    return [(torch.arange(n).float().view(1, 1, n, 1), -torch.arange(n).float().view(1, 1, n, 1))
            for _ in range(layers)]


def test_longest_block_aligned_prefix_is_reused_and_namespaced():
    cache = PrefixCache(max_tokens=1000, block_size=4)
    a = list(range(10))
    assert cache.lookup("m", a) == (0, None)
    assert cache.insert("m", a, _kv(10)) == 8
    n, kv = cache.lookup("m", a[:6] + [99, 98, 97])
    assert n == 4 and kv[0][0].shape[2] == 4
    assert cache.lookup("m", a)[0] == 8
    assert cache.lookup("m", a[:8])[0] == 4  # one token must be left to compute
    assert cache.lookup("other", a)[0] == 0
    assert cache.tokens == 8 and cache.usage == 0.008


def test_lru_eviction_keeps_the_token_budget():
    cache = PrefixCache(max_tokens=16, block_size=4)
    cache.insert("m", list(range(8)), _kv(8))
    cache.insert("m", list(range(100, 108)), _kv(8))
    cache.lookup("m", list(range(9)))  # touch the first
    cache.insert("m", list(range(200, 208)), _kv(8))
    assert cache.tokens == 16
    assert cache.lookup("m", list(range(9)))[0] == 8
    assert cache.lookup("m", list(range(100, 109)))[0] == 0
    assert cache.insert("m", list(range(40)), _kv(40)) == 0  # larger than the budget


def test_block_hashes_chain_over_the_whole_prefix():
    assert block_hashes("m", [1, 2, 3, 4], 2)[0] == block_hashes("m", [1, 2, 9, 9], 2)[0]
    assert block_hashes("m", [1, 2, 3, 4], 2)[1] != block_hashes("m", [0, 2, 3, 4], 2)[1]


def test_stop_strings_and_held_back_text():
    assert find_stop("hello END there", ["END", "the"]) == 6
    assert safe_emit_length("hello EN", ["END"], finished=False) == 6
    assert safe_emit_length("hello EN", ["END"], finished=True) == 8
    assert safe_emit_length("caf\ufffd", [], finished=False) == 3
