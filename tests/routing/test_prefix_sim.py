"""The cluster simulator: its KV cache model, and the policy comparison on the seed preset."""
from __future__ import annotations

import pytest

from app.core.prefix_sim import POLICIES, RadixLRU, SimParams, best_non_oracle, simulate
from app.routing.workload import LINE_KEYS, seed_workload, to_lines


def test_radix_cache_shares_prefixes_and_evicts_leaves_first():
    cache = RadixLRU(capacity=900)
    assert cache.insert([(1, 400), (2, 100)]) == 0
    assert cache.insert([(1, 400), (3, 100)]) == 400          # shared system prompt
    assert cache.insert([(1, 400), (2, 100), (4, 50)]) == 500
    assert cache.used == 650
    cache.insert([(9, 300)])                                   # needs room: evict oldest leaf
    assert cache.used == 850
    assert cache.match([(1, 400)])[0] == 400                   # hot prefix survived
    assert cache.match([(1, 400), (3, 100)])[0] == 400         # (3) was the oldest leaf


def test_radix_cache_never_exceeds_capacity_and_caps_oversized_prompts():
    cache = RadixLRU(capacity=500)
    for i in range(200):
        cache.insert([(i % 7, 120), (1000 + i, 90), (5000 + i, 300)])
        assert cache.used <= 500
    assert cache.insert([(1, 400), (2, 400)]) == 0
    assert cache.used <= 500


def test_workload_lines_have_the_issue_format():
    rows = seed_workload(300, seed=3)
    assert len(rows) == 300
    line = to_lines(rows[:1])[0]
    import json
    obj = json.loads(line)
    assert tuple(obj) == LINE_KEYS
    assert obj["segments"][0][1] + obj["segments"][1][1] == 4500     # static prefix
    assert all(a["arrival_ms"] <= b["arrival_ms"] for a, b in zip(rows, rows[1:]))
    teams = {r["team"] for r in seed_workload(3000, seed=3)}
    assert len(teams) == 14
    assert any(r["session_id"] for r in rows) and any(r["session_id"] is None for r in rows)


@pytest.fixture(scope="module")
def seed_result():
    # A smaller seed preset (6,000 requests, ~5 minutes of traffic) on 8 replicas.
    return simulate(seed_workload(6000, seed=28), SimParams(replicas=8))


def test_sluice_keeps_the_cache_and_the_balance(seed_result):
    pols = seed_result["policies"]
    assert set(pols) == set(POLICIES)
    sluice = pols["sluice"]
    best, best_rate = best_non_oracle(seed_result)
    assert best_rate - sluice["hit_rate"] <= 0.05
    assert sluice["hit_rate"] >= 0.87
    assert sluice["max_over_mean_load"] <= 1.25


def test_round_robin_collapses_and_sticky_hashing_piles_up(seed_result):
    pols = seed_result["policies"]
    for name in ("round_robin", "random", "least_loaded"):
        assert pols[name]["hit_rate"] < pols["sluice"]["hit_rate"] - 0.05
    for name in ("consistent_hash", "prefix_trie"):
        assert pols[name]["max_over_mean_load"] > 1.5
    assert pols["sluice"]["ttft_p99_ms"] < pols["round_robin"]["ttft_p99_ms"]
    for name, r in pols.items():
        assert r["hit_rate"] <= pols["oracle"]["hit_rate"] + 0.01, name


def test_one_replica_with_ample_cache_sees_the_seed_single_node_hit_rate():
    # FL-28B: 89% on one node. The preset is built to match that, not to favour a policy.
    res = simulate(seed_workload(3000, seed=28), SimParams(replicas=1, kv_tokens=10**8),
                   ["round_robin"])
    assert 0.87 <= res["policies"]["round_robin"]["hit_rate"] <= 0.93
