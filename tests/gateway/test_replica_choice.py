"""S03 through the gateway: rendezvous on the session (or static prefix), bounded by the
live in-flight load in Redis, and the tenant's cache salt sent to the engine."""
from __future__ import annotations

import httpx

from app.core.rendezvous import LOAD_FLOOR, ReplicaView, affinity_key, hrw_order
from app.contract.inflight import InflightTracker, read_loads
from tests.gateway.conftest import make_world, wait_for

MSGS = [{"role": "system", "content": "You route tickets."},
        {"role": "user", "content": "where does this go"}]


def _send(w, session: str | None = None, **extra) -> httpx.Response:
    headers = {"authorization": f"Bearer {w.key}"}
    if session:
        headers["x-sluice-session"] = session
    r = httpx.post(w.base_url + "/chat/completions", headers=headers, timeout=30,
                   json={"model": "tier-1", "messages": MSGS, **extra})
    assert r.status_code == 200, r.text
    return r


def _by_name(fake_replicas, w) -> dict:
    """fake replica name (x-fake-replica) -> Replica row"""
    url_to_name = {s.url: f"r{i}" for i, s in enumerate(fake_replicas)}
    return {url_to_name[r.url]: r for r in w.pool.replicas}


def test_sessions_stick_to_their_rendezvous_replica(world, fake_replicas):
    rows = _by_name(fake_replicas, world)
    views = [ReplicaView(id=r.id) for r in rows.values()]
    # the tenant's cache salt (on by default) is part of the key: read the one it sends
    probe = _send(world, "probe").headers["x-fake-replica"]
    salt = httpx.get(fake_replicas[int(probe[1:])].url + "/stats").json()["last_body"][
        "cache_salt"]
    seen = set()
    for i in range(16):
        sid = f"sess-{i}"
        want = hrw_order(affinity_key(sid, None, salt=salt), views)[0].id
        names = {_send(world, sid).headers["x-fake-replica"] for _ in range(2)}
        assert len(names) == 1
        assert rows[names.pop()].id == want
        seen.add(want)
    assert len(seen) == 2  # sessions spread over both replicas


def test_bounded_load_spills_to_the_next_replica(app, world, fake_replicas, redis_client):
    ns = app.config["REDIS_NAMESPACE"]
    rows = _by_name(fake_replicas, world)
    ids = [r.id for r in rows.values()]
    home = _send(world, "busy-session").headers["x-fake-replica"]
    other = next(n for n in rows if n != home)
    wait_for(lambda: sum(read_loads(redis_client, ids, ns).values()) == 0,
             what="in-flight released")
    tracker = InflightTracker(redis_client, ns, gateway_id="another-gateway")
    busy = int(LOAD_FLOOR) + 4      # past the load floor and c x mean
    for _ in range(busy):
        tracker.acquire(rows[home].id)  # another gateway's requests on the home replica
    try:
        assert _send(world, "busy-session").headers["x-fake-replica"] == other
    finally:
        for _ in range(busy):
            tracker.release(rows[home].id)
    assert _send(world, "busy-session").headers["x-fake-replica"] == home


def test_in_flight_is_counted_while_the_request_runs(app, world, fake_replicas, redis_client):
    import threading
    ns = app.config["REDIS_NAMESPACE"]
    ids = [r.id for r in world.pool.replicas]
    t = threading.Thread(target=_send, args=(world, "slow"),
                         kwargs={"messages": [{"role": "user", "content": "x [[delay:2500]]"}]})
    t.start()
    wait_for(lambda: sum(read_loads(redis_client, ids, ns).values()) == 1, what="counted")
    t.join(30)
    wait_for(lambda: sum(read_loads(redis_client, ids, ns).values()) == 0, what="released")


def test_cache_salt_per_tenant_when_the_policy_asks(app, gateway, fake_replicas, frontier):
    w = make_world(app, gateway, [fake_replicas[0].url], frontier.url,
                   policy={"cache_salt": True})
    _send(w)
    body = httpx.get(fake_replicas[0].url + "/stats").json()["last_body"]
    salt = body["cache_salt"]
    # an HMAC digest, not the tenant id in clear (a substring check on hex is flaky:
    # tenant 42's digest may well contain "42")
    assert len(salt) == 32 and set(salt) <= set("0123456789abcdef")
    _send(w)
    assert httpx.get(fake_replicas[0].url + "/stats").json()["last_body"]["cache_salt"] == salt


def test_round_robin_policy_ignores_the_session(app, gateway, fake_replicas, frontier):
    # The baseline bench/prefix_routing.py compares with: replica_choice=round_robin.
    rr = make_world(app, gateway, [s.url for s in fake_replicas], frontier.url,
                    policy={"replica_choice": "round_robin"})
    names = [_send(rr, "one-session").headers["x-fake-replica"] for _ in range(6)]
    assert len(set(names)) == 2 and all(a != b for a, b in zip(names, names[1:]))
    # (under the default, sluice, a session stays on one replica: the first test above)
