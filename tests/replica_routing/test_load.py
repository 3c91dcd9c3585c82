"""Live load in real Redis: in-flight counts of several gateway processes plus scraped
queue depth, and what a crashed gateway leaves behind."""
from __future__ import annotations

import asyncio
import time

import redis.asyncio as aioredis

from app.core.rendezvous import ReplicaView, pick_replica
from app.contract.inflight import (AsyncInflightTracker, InflightTracker, cache_salt, cache_salt_for,
                              read_loads, read_loads_async,
                              read_loads_pending)


def test_two_gateways_add_up_and_release(app, redis_client):
    ns = app.config["REDIS_NAMESPACE"] + ":load1"
    g1 = InflightTracker(redis_client, ns, gateway_id="gw-a")
    g2 = InflightTracker(redis_client, ns, gateway_id="gw-b")
    g1.acquire(1)
    g1.acquire(1)
    g2.acquire(1)
    g2.acquire(2)
    assert read_loads(redis_client, [1, 2, 3], ns) == {1: 3.0, 2: 1.0, 3: 0.0}
    with g1.track(3):
        assert read_loads(redis_client, [3], ns) == {3: 1.0}
    g1.release(1)
    g2.release(2)
    assert read_loads(redis_client, [1, 2, 3], ns) == {1: 2.0, 2: 0.0, 3: 0.0}


def test_scraped_waiting_is_added(app, redis_client):
    ns = app.config["REDIS_NAMESPACE"] + ":load2"
    redis_client.hset(f"{ns}:replica:7:stats", mapping={"num_requests_waiting": "4",
                                                        "num_requests_running": "9"})
    InflightTracker(redis_client, ns, gateway_id="gw").acquire(7)
    assert read_loads(redis_client, [7], ns) == {7: 5.0}


def test_crashed_gateway_load_expires(app, redis_client):
    ns = app.config["REDIS_NAMESPACE"] + ":load3"
    alive = InflightTracker(redis_client, ns, gateway_id="alive", ttl_s=30)
    crashed = InflightTracker(redis_client, ns, gateway_id="crashed", ttl_s=30)
    crashed.acquire(1)
    crashed.acquire(1)
    alive.acquire(1)
    now = time.time()
    assert read_loads(redis_client, [1], ns, now=now) == {1: 3.0}
    # 40 s later: only the process that kept refreshing still counts.
    alive.redis.hset(f"{ns}:replica:1:inflight_seen", "alive", f"{now + 40:.3f}")
    assert read_loads(redis_client, [1], ns, now=now + 40) == {1: 1.0}
    assert redis_client.ttl(f"{ns}:replica:1:inflight") > 0      # key itself expires too


def test_refresh_rewrites_absolute_counts(app, redis_client):
    ns = app.config["REDIS_NAMESPACE"] + ":load4"
    g = InflightTracker(redis_client, ns, gateway_id="gw")
    g.acquire(5)
    g.acquire(5)
    redis_client.delete(f"{ns}:replica:5:inflight")            # a lost write
    assert read_loads(redis_client, [5], ns) == {5: 0.0}
    g.refresh()
    assert read_loads(redis_client, [5], ns) == {5: 2.0}


def test_loads_steer_pick_replica(app, redis_client):
    ns = app.config["REDIS_NAMESPACE"] + ":load5"
    replicas = [ReplicaView(i) for i in (1, 2, 3, 4)]
    home = pick_replica("session-42", replicas, read_loads(redis_client, [1, 2, 3, 4], ns))
    g = InflightTracker(redis_client, ns, gateway_id="gw")
    for _ in range(6):
        g.acquire(home.id)                                      # home is now over 1.25 x mean
    moved = pick_replica("session-42", replicas, read_loads(redis_client, [1, 2, 3, 4], ns))
    assert moved.id != home.id


def test_async_tracker_and_reader(app, redis_client):
    ns = app.config["REDIS_NAMESPACE"] + ":load6"

    async def scenario():
        client = aioredis.from_url(app.config["REDIS_URL"])
        try:
            t = AsyncInflightTracker(client, ns, gateway_id="agw")
            await t.acquire(1)
            async with t.track(2):
                inside = await read_loads_async(client, [1, 2], ns)
            await t.refresh()
            after = await read_loads_async(client, [1, 2], ns)
            return inside, after
        finally:
            await client.aclose()

    inside, after = asyncio.run(scenario())
    assert inside == {1: 1.0, 2: 1.0}
    assert after == {1: 1.0, 2: 0.0}
    assert read_loads(redis_client, [1], ns) == {1: 1.0}       # sync reader sees it too


def test_cache_salt_is_stable_per_tenant_and_secret():
    assert cache_salt(3, "s1") == cache_salt("3", "s1")
    assert cache_salt(3, "s1") != cache_salt(4, "s1")
    assert cache_salt(3, "s1") != cache_salt(3, "s2")
    assert cache_salt_for({"cache_salt": False}, 3, "s1") is None
    assert cache_salt_for({"cache_salt": True}, 3, "s1") == cache_salt(3, "s1")


def test_kv_events_reads_the_same_loads_with_the_index_in_one_call(app, redis_client):
    """S03 kv_events reads loads, matched blocks and the routed tally in one script call;
    its loads are read_loads' (crashed gateways and queues included)."""
    from app.contract import kv_index
    from app.contract.keys import Keys
    ns = app.config["REDIS_NAMESPACE"] + ":load-kv"
    keys = Keys(ns)
    g1 = InflightTracker(redis_client, ns, gateway_id="gw-a")
    g1.acquire(1)
    g1.acquire(2)
    g1.acquire(2)
    redis_client.hset(keys.replica_inflight(3), "gw-dead", 4)          # never refreshed
    redis_client.hset(keys.replica_inflight_seen(3), "gw-dead", time.time() - 100)
    redis_client.hset(keys.replica_stats(3), "num_requests_waiting", "2.5")
    chain = [bytes([n]) * 32 for n in range(1, 6)]
    kv_index.apply_events(redis_client, keys, 1, [("BlockStored", chain[:3])], seq=0)
    kv_index.apply_events(redis_client, keys, 2, [("BlockStored", chain)], seq=0)
    redis_client.hincrby(keys.replica_kv_state(2), "routed", 7)
    ids = [1, 2, 3]
    loads, matched, routed, pending = kv_index.read_route_inputs(redis_client, keys, ids,
                                                                 chain, 16)
    assert loads == read_loads(redis_client, ids, ns) == {1: 1.0, 2: 2.0, 3: 2.5}
    assert matched == {1: 48.0, 2: 80.0}                 # replica 3 has no index: stale
    assert routed == {1: 0.0, 2: 7.0, 3: 0.0}
    assert pending == {}                                 # no streamed request counted
    other = [bytes([9]) * 32, *chain[1:]]                # the first block held nowhere
    assert kv_index.read_matched(redis_client, keys, ids, other, 16) == {}
    redis_client.hset(keys.replica_kv_state(1), "seen", time.time() - 60)
    redis_client.hset(keys.replica_kv_state(2), "seen", time.time() - 60)
    assert kv_index.read_route_inputs(redis_client, keys, ids, chain, 16)[1] is None

    async def read():
        client = aioredis.from_url(app.config["REDIS_URL"])
        try:
            return await kv_index.read_route_inputs_async(client, keys, ids, chain, 16)
        finally:
            await client.aclose()
    assert asyncio.run(read())[0] == loads
    redis_client.script_flush()          # Redis lost its scripts (a restart): loaded again
    assert read_loads(redis_client, ids, ns) == loads
    assert asyncio.run(read())[0] == loads
    for key in redis_client.scan_iter(f"{ns}:*"):
        redis_client.delete(key)


def test_prefill_pending_counts_until_the_first_token_and_goes_with_its_gateway(
        app, redis_client):
    """A streamed request's unmatched prompt tokens count on its replica from its acquire
    until its first token; the first token only lowers the process's own figure, which
    its next write carries (no round trip of its own); a release takes what the request
    still counted; a crashed gateway's figure goes with its seen time."""
    from app.contract import kv_index
    from app.contract.keys import Keys
    ns = app.config["REDIS_NAMESPACE"] + ":load-pend"
    keys = Keys(ns)
    ids = [1, 2]
    try:
        for rid in ids:
            kv_index.apply_events(redis_client, keys, rid, [], seq=0)

        def pending():
            got = kv_index.read_route_inputs(redis_client, keys, ids, [], 16)
            return got[3]
        g1 = InflightTracker(redis_client, ns, gateway_id="gw-a")
        g2 = InflightTracker(redis_client, ns, gateway_id="gw-b")
        g1.acquire(1, 3000)
        g2.acquire(1, 500)
        g2.acquire(2)                                   # not streamed: nothing pending
        assert pending() == {1: 3500.0}
        assert read_loads_pending(redis_client, ids, ns) == (       # the Routing page's
            {1: 2.0, 2: 1.0}, {1: 3500, 2: 0})
        # the pending fields sit in the inflight hash; the load's sum never counts them
        assert read_loads(redis_client, ids, ns) == {1: 2.0, 2: 1.0}
        g1.prefilled(1, 3000)                           # its first token: not yet written
        assert pending() == {1: 3500.0}
        g1.acquire(1, 0)                                # the next write carries it
        assert pending() == {1: 500.0}
        g2.release(1, 500)                              # done before its first token
        assert pending() == {}
        assert read_loads(redis_client, ids, ns) == {1: 2.0, 2: 1.0}
        g1.acquire(2, 800)
        g1.release(2, 800)
        g1.release(1)
        g1.release(1)
        assert redis_client.hlen(keys.replica_inflight(1)) == 0
        # a gateway that stops refreshing: its pending prefill stops counting with its load
        crashed = InflightTracker(redis_client, ns, gateway_id="gw-dead")
        crashed.acquire(2, 4000)
        assert pending() == {2: 4000.0}
        redis_client.hset(keys.replica_inflight_seen(2), "gw-dead", time.time() - 100)
        assert pending() == {}
        assert read_loads_pending(redis_client, ids, ns)[1] == {1: 0, 2: 0}
        assert redis_client.hget(keys.replica_inflight(2), "p:gw-dead") == b"4000"
        assert redis_client.ttl(keys.replica_inflight(2)) > 0    # the key expires too
    finally:
        for key in redis_client.scan_iter(f"{ns}:*"):
            redis_client.delete(key)


def test_a_replica_that_joins_counts_its_requests_sent_from_the_mean(app, redis_client):
    """The bound on requests sent compares replicas' totals. A replica that joins the set
    (scale-out, or back after its entry went with its death or restart) would count 0
    against the others' whole past: every request would leave the replicas holding its
    blocks until it caught up (a fifth of the others' history on 4 replicas). It starts at
    the mean of the others instead; a new set starts at 0."""
    from app.contract import kv_index
    from app.contract.keys import Keys
    from app.core.kv_routing import kv_choice
    from app.core.rendezvous import ReplicaView
    keys = Keys(app.config["REDIS_NAMESPACE"] + ":load-kv-join")
    chain = [bytes([n]) * 32 for n in range(1, 9)]
    try:
        for rid in (1, 2, 3):
            kv_index.apply_events(redis_client, keys, rid, [], seq=0)
        ids = [1, 2, 3]
        assert kv_index.read_route_inputs(redis_client, keys, ids, chain, 16)[2] == {
            1: 0.0, 2: 0.0, 3: 0.0}
        # three gateways' tallies of earlier choices, added by the next call
        got = kv_index.read_route_inputs(redis_client, keys, ids, chain, 16,
                                         tally={1: (300, 0, 0), 2: (280, 0, 0),
                                                3: (310, 0, 0)})
        assert got[2] == {1: 300.0, 2: 280.0, 3: 310.0}
        # replica 1 holds the prompt; replica 3 dies and comes back (its entry starts
        # anew), replica 4 is added
        kv_index.apply_events(redis_client, keys, 1, [("BlockStored", chain)], seq=1)
        kv_index.forget(redis_client, keys, 3)
        kv_index.apply_events(redis_client, keys, 3, [], seq=0)
        kv_index.apply_events(redis_client, keys, 4, [], seq=0)
        ids = [1, 2, 3, 4]
        loads, matched, routed, _ = kv_index.read_route_inputs(redis_client, keys, ids,
                                                               chain, 16)
        assert routed == {1: 300.0, 2: 280.0, 3: 290.0, 4: 290.0}
        views = [ReplicaView(id=i) for i in ids]
        choice, how = kv_choice("k", views, matched, loads, prompt_tokens=128, routed=routed)
        assert (choice.id, how) == (1, "kv")          # the holder of the prompt's blocks
        # counted from 0, the joined replicas would take it (the holder over the bound)
        from_zero = {**routed, 3: 0.0, 4: 0.0}
        assert kv_choice("k", views, matched, loads, prompt_tokens=128,
                         routed=from_zero)[0].id in (3, 4)
        # the base is set once: later choices add to it, and every reader sees the same
        got = kv_index.read_route_inputs(redis_client, keys, ids, chain, 16, tally={4: (5, 0, 0)})
        assert got[2] == {1: 300.0, 2: 280.0, 3: 290.0, 4: 295.0}
        # the Routing page's count is the requests actually sent
        assert kv_index.freshness(redis_client, keys, [4])[4]["routed"] == 5
    finally:
        for key in redis_client.scan_iter(f"{keys.ns}:*"):
            redis_client.delete(key)


def test_a_long_prompt_matches_its_leading_blocks_only(app, redis_client):
    """The script asks for a prompt's first block, then the rest in runs of 256: a match
    stops at the first block a replica lacks, on either side of a run's edge (a replica
    without the first block matches nothing, whatever else it holds), and a prompt of 2,000
    blocks (32k tokens) is read in one call."""
    from app.contract import kv_index
    from app.contract.keys import Keys
    keys = Keys(app.config["REDIS_NAMESPACE"] + ":load-kv-long")
    chain = [n.to_bytes(4, "big") * 8 for n in range(2000)]
    held = {1: chain[:300], 2: chain[:256] + chain[257:], 3: chain[:256],
            4: chain[:10] + chain[11:], 5: chain, 6: chain[:257], 7: chain[:258],
            8: chain[1:], 9: chain[:1], 10: chain[:2]}
    for rid, blocks in held.items():
        kv_index.apply_events(redis_client, keys, rid, [("BlockStored", blocks)], seq=0)
    matched = kv_index.read_matched(redis_client, keys, list(held), chain, 16)
    assert matched == {1: 300 * 16.0, 2: 256 * 16.0, 3: 256 * 16.0, 4: 10 * 16.0,
                       5: 2000 * 16.0, 6: 257 * 16.0, 7: 258 * 16.0, 9: 16.0, 10: 32.0}
    for key in redis_client.scan_iter(f"{keys.ns}:*"):
        redis_client.delete(key)


def test_the_tally_sends_requests_every_call_and_token_shares_once_a_second(
        app, redis_client, monkeypatch):
    """The gateway's tally of its earlier choices: the requests sent go with every S03
    call (the bound reads them), the matched and prompt tokens (the Routing page's share)
    at most once a second per replica, and none of either is lost on the way."""
    from app.contract import kv_index
    from app.contract.keys import Keys
    from app.gateway.stages import s03_prefill as s03
    monkeypatch.setattr(s03, "_pending", {})
    monkeypatch.setattr(s03, "_shares_due", {})
    keys = Keys(app.config["REDIS_NAMESPACE"] + ":tally-shares")
    chain = [bytes([n]) * 32 for n in range(1, 4)]
    sent = []

    def call(ids):
        carry = s03._carry(ids)
        sent.append(carry)
        kv_index.read_route_inputs(redis_client, keys, ids, chain, 16, tally=carry)
    try:
        kv_index.apply_events(redis_client, keys, 1, [("BlockStored", chain)], seq=0)
        kv_index.apply_events(redis_client, keys, 2, [], seq=0)
        s03._add(1, 1, 48, 60)
        call([1, 2])                          # the first: all of it
        assert sent[-1] == {1: [1, 48, 60]}
        s03._add(1, 1, 48, 70)
        s03._add(2, 1, 0, 70)
        s03._add(1, 1, 32, 50)
        call([1, 2])                          # within the second: requests only for 1
        assert sent[-1] == {1: (2, 0, 0), 2: [1, 0, 70]}
        call([1, 2])                          # nothing sent since: nothing goes
        assert sent[-1] == {}
        fresh = kv_index.freshness(redis_client, keys, [1, 2])
        assert fresh[1]["routed"] == 3 and fresh[1]["matched_share"] == 48 / 60
        assert fresh[2]["routed"] == 1 and fresh[2]["matched_share"] == 0.0
        s03._shares_due[1] = 0.0              # a second later: the held tokens go
        call([1])
        assert sent[-1] == {1: [0, 80, 120]}
        fresh = kv_index.freshness(redis_client, keys, [1])
        assert fresh[1]["routed"] == 3 and fresh[1]["matched_share"] == 128 / 180
        assert s03._pending == {}
    finally:
        for key in redis_client.scan_iter(f"{keys.ns}:*"):
            redis_client.delete(key)
