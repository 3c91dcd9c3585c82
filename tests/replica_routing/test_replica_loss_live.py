"""CD-28C on real reference-engine replicas behind a real gateway: stop 2 of 4 mid-load.

Slow-ish (4 tiny engines on CPU, ~60 sequential requests); one drill run serves all tests.
"""
from __future__ import annotations

import pytest

from app.replica_routing.drill import run_replica_loss
from tests.engine.conftest import tiny_engines
from tests.gateway.conftest import make_world


@pytest.fixture(scope="module")
def four_engines(tmp_path_factory):
    with tiny_engines(tmp_path_factory, [["--max-prefix-tokens", "8192"]] * 4) as engines:
        yield engines


@pytest.fixture()
def drill_result(app, gateway, frontier, four_engines):
    world = make_world(app, gateway, [e.url for e in four_engines], frontier.url,
                       policy={"session_key": "header"})
    reps = [{"id": r.id, "url": r.url} for r in world.pool.replicas]
    by_url = {e.url: e for e in four_engines}

    def stop(chosen):
        for r in chosen:
            by_url[r["url"]].stop()

    ids = sorted(r["id"] for r in reps)
    # the first and third replica: not the tail of the list, which a hash-mod-N picker
    # would survive by luck
    return run_replica_loss(gateway.url, world.key, reps, stop, victims=[ids[0], ids[2]],
                            stop_count=2, sessions=12,
                            turns_before=2, turns_after=3, model="tier-1", max_tokens=4,
                            prompt_words=120, timeout_s=60)


def test_losing_two_of_four_replicas(drill_result):
    r = drill_result
    assert r["requests"] == 60
    assert len(r["stopped"]) == 2
    assert r["unattributed"] == 0                   # every request seen on exactly one replica
    assert r["failed_requests"] == 0, r["failures"]  # retried before the first byte
    assert r["served_by_dead_after_loss"] == 0
    assert r["sessions_on_dead_replicas"] > 0, r
    assert r["sessions_moved"] >= r["sessions_on_dead_replicas"]
    after = [t["hit_rate"] for t in r["turns"] if t["after_loss"]]
    assert after[-1] > after[0]                     # moved sessions rebuild their history
    # Only the dead replicas' sessions may move: S03 picks by rendezvous hashing.
    assert r["sessions_moved_from_live_replicas"] == 0, r
