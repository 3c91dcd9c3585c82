"""The node's KV-event subscriber under the pools.kv_index beat: started once per node (a
lease in Redis), fed the node's healthy replicas of pools that publish events, a replica
that goes down loses its blocks, another lease holder stops it."""
from __future__ import annotations

import time

import torch

from app.contract.keys import Keys
from app.engine.kv_events import CacheEvents, ZmqEventPublisher
from app.engine.prefix_cache import PrefixCache
from tests.engine.conftest import free_port
from tests.gateway.conftest import wait_for


def _kv(n: int) -> list:
    return [(torch.zeros(1, 1, n, 1), torch.zeros(1, 1, n, 1))]


def test_subscriber_is_supervised_per_node_and_follows_replica_health(app, redis_client):
    from app.catalog.models import Pool, Replica
    from app.extensions import db
    from workers.pools import driver
    port = free_port()
    node = f"kvnode{time.monotonic_ns()}"
    pool = Pool(name=f"kv-{node}", model="tiny", served_model_name="tiny", engine="reference",
                node=node, options={"kv_events": {"endpoint": f"tcp://*:{port}"}})
    db.session.add(pool)
    db.session.flush()
    rep = Replica(pool_id=pool.id, index=0, url="http://127.0.0.1:9", state="healthy")
    db.session.add(rep)
    db.session.commit()
    keys = Keys(app.config["REDIS_NAMESPACE"])
    publisher = ZmqEventPublisher(f"tcp://127.0.0.1:{port}", topic="kv@tiny-0")
    cache = PrefixCache(4096, 4, CacheEvents(publisher, 4, "tiny"))
    lease = keys.kv_subscriber_lease(node)
    try:
        assert driver.kv_event_sources(node) == [{
            "id": rep.id, "endpoint": f"tcp://127.0.0.1:{port}",
            "replay": f"tcp://127.0.0.1:{port + 100}", "topic": "kv@tiny-0"}]
        assert driver.kv_index_node(node) == "started"
        assert driver.kv_index_node(node) == "running"
        time.sleep(0.5)                                   # the SUB socket joins
        # ten engine blocks of 4 tokens: the index keys 16-token pieces, two of them
        cache.insert("tiny\x00", list(range(40)), _kv(40))
        wait_for(lambda: redis_client.scard(keys.replica_kv_blocks(rep.id)) == 2,
                 what="blocks indexed")
        rep.state = "down"
        db.session.commit()
        driver.kv_index_node(node)
        wait_for(lambda: not redis_client.exists(keys.replica_kv_blocks(rep.id)),
                 what="a down replica's blocks dropped")
    finally:
        redis_client.set(lease, "another-process")        # it stops at its next renewal
        from workers.pools import kv_subscriber
        thread = kv_subscriber._state["thread"]
        thread.join(10)
        assert not thread.is_alive()
        redis_client.delete(lease)
        publisher.shutdown()
