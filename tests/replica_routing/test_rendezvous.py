"""Properties of the S03 replica picker, on plain data."""
from __future__ import annotations

import math
import random
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from app.core.rendezvous import (LOAD_FLOOR, PREFIX_CHOICES, SESSION_CHOICES, ReplicaView,
                                 affinity_key, choices_for_key, hrw_order, load_bound,
                                 pick_replica, sluice_choice)

ids = st.lists(st.integers(min_value=1, max_value=10_000), min_size=2, max_size=12, unique=True)
keys = st.lists(st.text(min_size=1, max_size=24), min_size=1, max_size=40, unique=True)
weights = st.sampled_from([0.5, 1.0, 1.0, 2.0, 4.0])


def view(replica_ids, weight_of=lambda i: 1.0, healthy=lambda i: True):
    return [ReplicaView(id=i, url=f"http://r{i}", weight=weight_of(i), healthy=healthy(i))
            for i in replica_ids]


@settings(max_examples=60, deadline=None)
@given(ids, keys, st.data())
def test_two_independent_pickers_agree(replica_ids, key_list, data):
    w = {i: data.draw(weights) for i in replica_ids}
    loads = {i: data.draw(st.integers(0, 20)) for i in replica_ids}
    first = view(replica_ids, w.get)
    shuffled = list(replica_ids)
    random.Random(data.draw(st.integers())).shuffle(shuffled)
    second = view(shuffled, w.get)            # built separately, other order
    loads2 = {i: loads[i] for i in reversed(replica_ids)}
    for key in key_list:
        assert pick_replica(key, first, loads).id == pick_replica(key, second, loads2).id
        assert [r.id for r in hrw_order(key, first)] == [r.id for r in hrw_order(key, second)]


@settings(max_examples=60, deadline=None)
@given(ids, keys, st.data())
def test_removing_a_replica_moves_only_its_keys(replica_ids, key_list, data):
    w = {i: data.draw(weights) for i in replica_ids}
    gone = data.draw(st.sampled_from(replica_ids))
    before = {k: pick_replica(k, view(replica_ids, w.get)).id for k in key_list}
    after = {k: pick_replica(k, view([i for i in replica_ids if i != gone], w.get)).id
             for k in key_list}
    for k in key_list:
        if before[k] != gone:
            assert after[k] == before[k]
        else:
            assert after[k] != gone


@settings(max_examples=60, deadline=None)
@given(ids, keys, st.integers(min_value=10_001, max_value=20_000), weights)
def test_adding_a_replica_moves_keys_only_to_it(replica_ids, key_list, new_id, new_w):
    before = {k: pick_replica(k, view(replica_ids)).id for k in key_list}
    grown = view(replica_ids) + [ReplicaView(id=new_id, weight=new_w)]
    for k in key_list:
        now = pick_replica(k, grown).id
        assert now in (before[k], new_id)


@settings(max_examples=60, deadline=None)
@given(ids, keys, st.data(), st.sampled_from([1.0, 1.1, 1.25, 1.5, 2.0]))
def test_bound_never_exceeded_when_some_replica_is_under_it(replica_ids, key_list, data, c):
    w = {i: data.draw(weights) for i in replica_ids}
    loads = {i: data.draw(st.integers(0, 40)) for i in replica_ids}
    replicas = view(replica_ids, w.get)
    total = sum(loads.values())
    total_w = sum(w.values())

    def within(r):
        return loads[r.id] + 1 <= load_bound(total, r.weight, total_w, c)

    for key in key_list:
        chosen = pick_replica(key, replicas, loads, c)
        if any(within(r) for r in replicas):
            assert within(chosen)
            # and it is the first such replica in the key's own order
            assert chosen == next(r for r in hrw_order(key, replicas) if within(r))
        else:
            assert loads[chosen.id] / chosen.weight == min(loads[i] / w[i] for i in replica_ids)


def test_sequential_assignment_respects_c_times_mean():
    # Bounded-load hashing: assigning 5,000 sticky keys one by one never puts more than
    # ceil(c * mean) on a replica, even when one key is very hot.
    replicas = view(range(1, 9))
    loads: Counter = Counter()
    rng = random.Random(7)
    for n in range(5000):
        key = "hot" if rng.random() < 0.4 else f"k{rng.randrange(300)}"
        r = pick_replica(key, replicas, loads, 1.25)
        loads[r.id] += 1
        assert max(loads.values()) <= math.ceil(1.25 * (n + 1) / 8)


def test_unhealthy_and_zero_weight_replicas_are_never_picked():
    replicas = [ReplicaView(1, healthy=False), ReplicaView(2, weight=0.0), ReplicaView(3)]
    assert {pick_replica(f"k{i}", replicas).id for i in range(200)} == {3}
    assert pick_replica("k", [ReplicaView(1, healthy=False)]) is None
    assert pick_replica("k", []) is None


def test_weights_shift_key_share():
    replicas = [ReplicaView(1, weight=1.0), ReplicaView(2, weight=3.0)]
    share = Counter(pick_replica(f"key-{i}", replicas).id for i in range(8000))
    assert 0.70 < share[2] / 8000 < 0.80       # expected 3/4


def test_from_snapshot_row():
    r = ReplicaView.from_snapshot({"id": 4, "url": "http://x", "state": "healthy", "weight": 2})
    assert (r.id, r.url, r.weight, r.healthy) == (4, "http://x", 2.0, True)
    assert not ReplicaView.from_snapshot({"id": 5, "state": "starting"}).healthy


def test_affinity_key_prefers_session_then_static_prefix():
    sys_prompt = "You are the billing assistant." * 50
    assert affinity_key("sess-1", sys_prompt) == affinity_key("sess-1", "other prompt")
    a = affinity_key(None, sys_prompt + " user question one", prefix_key_tokens=100)
    b = affinity_key(None, sys_prompt + " a different question", prefix_key_tokens=100)
    assert a == b                                  # only the first 100 tokens count
    assert a != affinity_key(None, "x" + sys_prompt, prefix_key_tokens=100)
    assert affinity_key(None, [1, 2, 3, 9], 3) == affinity_key(None, [1, 2, 3, 7], 3)
    assert affinity_key(None, sys_prompt, 100, salt="t1") != affinity_key(None, sys_prompt, 100,
                                                                           salt="t2")
    assert affinity_key(None, None, fallback="req-1") != affinity_key(None, None,
                                                                      fallback="req-2")


@settings(max_examples=60, deadline=None)
@given(ids, keys, st.data())
def test_any_choice_picks_the_least_loaded_replica_within_the_bound(replica_ids, key_list, data):
    loads = {i: data.draw(st.integers(0, 30)) for i in replica_ids}
    replicas = view(replica_ids)
    total = sum(loads.values())
    within = [i for i in replica_ids if loads[i] + 1 <= load_bound(total, 1.0, len(loads), 1.25)]
    for key in key_list:
        chosen = pick_replica(key, replicas, loads, 1.25, choices=None)
        if within:
            assert chosen.id in within and loads[chosen.id] == min(loads[i] for i in within)
        # with equal loads, every choice count falls back to the HRW first choice
        flat = {i: 3 for i in replica_ids}
        assert (pick_replica(key, replicas, flat, 1.25, choices=None)
                == hrw_order(key, replicas)[0])


def test_floor_keeps_a_near_idle_cluster_from_spilling():
    replicas = view([1, 2, 3, 4])
    home = pick_replica("sess", replicas)
    loads = {home.id: 1}                        # one other request in flight, on home
    assert pick_replica("sess", replicas, loads, 1.25).id != home.id   # ceil(1.25*2/4) = 1
    assert pick_replica("sess", replicas, loads, 1.25, floor=4).id == home.id
    assert pick_replica("sess", replicas, {home.id: 4}, 1.25, floor=4).id != home.id


def test_sluice_policy_keeps_sessions_home_and_spreads_static_prefixes():
    replicas = view(range(1, 9))
    session = affinity_key("sess-7", None)
    home = hrw_order(session, replicas)[0]
    busy = {home.id: LOAD_FLOOR - 1}           # far over c x mean, under the floor
    assert sluice_choice(session, replicas, busy).id == home.id
    over = {home.id: LOAD_FLOOR + 4, **{r.id: 2 for r in replicas if r != home}}
    assert sluice_choice(session, replicas, over).id == hrw_order(session, replicas)[1].id
    prefix = affinity_key(None, "You are the billing assistant." * 40)
    order = hrw_order(prefix, replicas)
    loads = {r.id: 5 for r in order}
    loads[order[5].id] = 1                     # the least loaded is sixth in HRW order
    assert sluice_choice(prefix, replicas, loads).id == order[5].id
    assert sluice_choice(prefix, replicas, {}).id == order[0].id   # idle: HRW first
    assert choices_for_key(session) == SESSION_CHOICES
    assert choices_for_key(prefix) == choices_for_key("r:req-1") == PREFIX_CHOICES


def test_gateway_simulator_and_bench_share_one_policy():
    # One definition: S03, the simulator's "sluice" policy and the bench (which drives the
    # gateway) cannot drift apart, and the simulator has no knob of its own for it.
    import ast
    import pathlib

    from app.core import prefix_sim
    from app.gateway.stages import s03_prefill
    assert s03_prefill.sluice_choice is sluice_choice
    assert prefix_sim.sluice_choice is sluice_choice
    assert not {"prefix_choices", "load_floor", "choices", "floor"} & set(
        prefix_sim.SimParams.__dataclass_fields__)
    def calls(path: pathlib.Path) -> set[str]:
        return {n.func.id for n in ast.walk(ast.parse(path.read_text()))
                if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}

    for path in (pathlib.Path(s03_prefill.__file__), pathlib.Path(prefix_sim.__file__)):
        assert "pick_replica" not in calls(path), path
    # the bench leaves the choice to the gateway's S03, switched by the policy field
    bench = pathlib.Path(__file__).resolve().parents[2] / "bench" / "prefix_routing.py"
    assert not {"pick_replica", "sluice_choice"} & calls(bench)
    assert '"replica_choice"' in bench.read_text()
