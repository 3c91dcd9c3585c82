"""Live load in real Redis: in-flight counts of several gateway processes plus scraped
queue depth, and what a crashed gateway leaves behind."""
from __future__ import annotations

import asyncio
import time

import redis.asyncio as aioredis

from app.core.rendezvous import ReplicaView, pick_replica
from app.contract.inflight import (AsyncInflightTracker, InflightTracker, cache_salt, cache_salt_for,
                              read_loads, read_loads_async)


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
