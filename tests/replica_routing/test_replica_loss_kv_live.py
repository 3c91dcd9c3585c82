"""CD-28C under ``replica_choice: kv_events``: 4 reference engines publish their KV events,
the node's subscriber keeps the Redis index, the gateway chooses from it; 2 of the 4 stop
mid-load. Nothing fails, the dead replicas' blocks leave the index, their sessions move and
rebuild their history, and the live replicas' sessions mostly keep being found where their
blocks are.

Slow-ish (4 tiny engines on CPU, ~60 sequential requests); one drill run serves all tests.
"""
from __future__ import annotations

import json
import threading

import httpx
import pytest
import redis as redis_lib

from app.contract import kv_index
from app.contract.keys import Keys
from app.replica_routing.drill import run_replica_loss
from tests.conftest import REDIS_URL
from tests.engine.conftest import free_port, tiny_engines
from tests.gateway.conftest import make_world, publish_and_wait, wait_for
from workers.pools.kv_subscriber import KVSubscriber


def _events_config(i: int) -> dict:
    return {"enable_kv_cache_events": True, "publisher": "zmq",
            "endpoint": f"tcp://127.0.0.1:{free_port()}",
            "replay_endpoint": f"tcp://127.0.0.1:{free_port()}", "topic": f"kv@drill-{i}"}


@pytest.fixture(scope="module")
def four_publishing_engines(tmp_path_factory):
    configs = [_events_config(i) for i in range(4)]
    with tiny_engines(tmp_path_factory, [["--max-prefix-tokens", "8192", "--kv-events-config",
                                          json.dumps(cfg)] for cfg in configs]) as engines:
        yield list(zip(engines, configs))


@pytest.fixture()
def drill(app, gateway, frontier, four_publishing_engines):
    from app.extensions import db
    engines = [e for e, _ in four_publishing_engines]
    world = make_world(app, gateway, [e.url for e in engines], frontier.url,
                       policy={"session_key": "header", "replica_choice": "kv_events"})
    world.pool.model = "smollm2"           # the tiny engines' tokenizer, which the gateway loads
    db.session.commit()
    publish_and_wait(gateway)
    keys = Keys(app.config["REDIS_NAMESPACE"])
    r = redis_lib.Redis.from_url(REDIS_URL)
    cfg_of = {e.url: cfg for e, cfg in four_publishing_engines}
    reps = [{"id": rep.id, "url": rep.url} for rep in world.pool.replicas]
    # the node's subscriber, fed the pool's healthy replicas as the pools.kv_index beat
    # hands them over (a stopped replica leaves the list, and its blocks the index)
    live = {rep["id"]: {"id": rep["id"], "endpoint": cfg_of[rep["url"]]["endpoint"],
                        "replay": cfg_of[rep["url"]]["replay_endpoint"],
                        "topic": cfg_of[rep["url"]]["topic"]} for rep in reps}
    sub = KVSubscriber(r, keys)
    stop_sub = threading.Event()
    thread = threading.Thread(target=sub.run, args=(stop_sub, lambda: list(live.values()), 0.2),
                              daemon=True)
    thread.start()
    by_url = {e.url: e for e in engines}
    held_at_stop: dict = {}

    def stop(chosen):
        for rep in chosen:
            held_at_stop[rep["id"]] = r.scard(keys.replica_kv_blocks(rep["id"]))
            by_url[rep["url"]].stop()
            live.pop(rep["id"], None)

    try:
        # the gateway loaded the pool's tokenizer when the snapshot arrived
        wait_for(lambda: httpx.get(gateway.url + "/healthz", timeout=5).json()
                 .get("kv_tokenizers", {}).get("smollm2") == "ready", timeout=60,
                 what="gateway's kv tokenizer")
        ids = sorted(rep["id"] for rep in reps)
        result = run_replica_loss(gateway.url, world.key, reps, stop, victims=[ids[0], ids[2]],
                                  stop_count=2, sessions=12, turns_before=2, turns_after=3,
                                  model="tier-1", max_tokens=4, prompt_words=120,
                                  timeout_s=60)
        wait_for(lambda: all(not r.exists(keys.replica_kv_blocks(rid))
                             for rid in held_at_stop), timeout=10,
                 what="the stopped replicas' blocks leave the index")
        # the gateway's tally of what the index matched for the requests it sent (the
        # next S03 call on the pool writes it: one more request)
        httpx.post(gateway.url + "/v1/chat/completions", timeout=60,
                   headers={"Authorization": f"Bearer {world.key}"},
                   json={"model": "tier-1", "max_tokens": 1,
                         "messages": [{"role": "user", "content": "flush the tally"}]})
        fresh = kv_index.freshness(r, keys, ids)
        yield {"result": result, "held_at_stop": held_at_stop, "fresh": fresh, "ids": ids}
    finally:
        stop_sub.set()
        thread.join(5)
        sub.close()
        for rid in live:
            kv_index.forget(r, keys, rid)
        r.close()


def test_losing_two_of_four_replicas_under_kv_events(drill):
    res, fresh = drill["result"], drill["fresh"]
    print(res, drill["held_at_stop"], fresh)     # shown when an assertion fails
    assert res["requests"] == 60
    assert res["unattributed"] == 0, res
    assert res["failed_requests"] == 0, res["failures"]   # retried before the first byte
    assert res["served_by_dead_after_loss"] == 0, res
    assert res["sessions_on_dead_replicas"] > 0, res
    # before the loss the bound on requests sent spread the sessions (with a tally written
    # once a second, 8 and 10 of the 12 sat on one replica and two replicas had none; with
    # new sessions placed by rendezvous alone, 4/2/2/4, see below)
    assert max(res["sessions_per_replica"].values()) <= 2 * 12 // 4, res
    assert res["sessions_moved"] >= res["sessions_on_dead_replicas"], res
    after = [t["hit_rate"] for t in res["turns"] if t["after_loss"]]
    assert after[-1] > after[0], res["turns"]            # moved sessions rebuild their history
    # The live replicas' sessions mostly stay: their blocks keep them home. Not all of them
    # need to: the dead replicas' sessions of a team whose prefix only one survivor holds all
    # go there, and the spread term (a share of the prompt per request sent above the other
    # survivor's) can then outweigh the one turn of history that keeps a live conversation
    # there, so it moves to the other survivor, which holds its team's prefix too. CI saw 1
    # of 6 move (replica ids 108-111); an offline model of the drill's choices shows that
    # mechanism and moves 0-2, by the ids and the prefix's share of the prompt. (When new
    # sessions were placed by rendezvous alone, a CI run put them 4/2/2/4 and then 4 moved:
    # the bound pushed a survivor's own sessions.)
    live_sessions = 12 - res["sessions_on_dead_replicas"]
    assert res["sessions_moved_from_live_replicas"] <= live_sessions // 3, res
    # the drill's verdict allows that much under kv_events, and none under rendezvous
    from app.replica_routing.drill import drill_passed, live_moves_allowed
    assert live_moves_allowed(res, "kv_events") == live_sessions // 3
    assert drill_passed(res, "kv_events"), res
    assert live_moves_allowed(res, "sluice") == 0
    # the stopped replicas held blocks, and the index dropped them
    assert any(n > 0 for n in drill["held_at_stop"].values()), drill["held_at_stop"]
    assert all(fresh[rid]["blocks"] == 0 and fresh[rid]["seq"] is None
               for rid in drill["held_at_stop"]), fresh
    # the live replicas' choices came from the index: most of what was sent there matched
    live = [rid for rid in drill["ids"] if rid not in drill["held_at_stop"]]
    for rid in live:
        assert fresh[rid]["blocks"] > 0 and fresh[rid]["routed"] > 0, fresh
        assert fresh[rid]["matched_share"] > 0.5, fresh
