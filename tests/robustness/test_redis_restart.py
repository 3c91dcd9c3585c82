"""Redis restarted (SIGKILL, then started again on its append-only file) under a live
gateway: requests keep being answered, the ledger events queued meanwhile reach the
stream afterwards, the settles Redis refused are retried (the holds go back to 0), and
every answered request has exactly one ledger row. Uses its own redis-server on a free
port, never the shared one."""
from __future__ import annotations

import json
import threading

import httpx
import pytest
import redis

from app.contract import budget as rb
from app.contract import leases
from app.contract.keys import Keys
from app.snapshot.service import build_snapshot
from tests.gateway.conftest import FRONTIER_KEY, Server, make_world, wait_for
from tests.robustness.faults import free_port, ledger_counts, report, request_ids, start_redis


@pytest.fixture()
def private_redis(tmp_path):
    port, procs = free_port(), []
    procs.append(start_redis(port, tmp_path))
    yield port, procs, tmp_path
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait(10)


def _post(url: str, key: str, text: str, stream: bool = False) -> tuple[int, str | None, bool]:
    body = {"model": "tier-1", "stream": stream, "messages": [{"role": "user", "content": text}]}
    with httpx.stream("POST", url, json=body, timeout=30,
                      headers={"authorization": f"Bearer {key}"}) as r:
        raw = r.read()
    done = raw.rstrip().endswith(b"[DONE]") if stream else b'"finish_reason":"stop"' in raw
    return r.status_code, r.headers.get("x-sluice-request-id"), r.status_code == 200 and done


def test_redis_restart_loses_no_ledger_row_and_leaks_no_hold(app, app_config, gateway,
                                                             fake_replicas, frontier,
                                                             private_redis):
    from app.factory import create_app
    from app.ledger.service import drain_stream
    port, procs, rdir = private_redis
    world = make_world(app, gateway, [fake_replicas[0].url], frontier.url)
    ns, url_r = "redisrestart", f"redis://127.0.0.1:{port}/0"
    r, k = redis.Redis(port=port), Keys(ns)
    snap = {**build_snapshot(), "version": 1}
    r.set(k.snapshot_data(), json.dumps(snap))
    r.set(k.snapshot_version(), 1)
    gw = Server("gateway", json.dumps({
        "REDIS_URL": url_r, "REDIS_NAMESPACE": ns, "GATEWAY_SNAPSHOT_POLL_S": 0.1,
        "GATEWAY_HEARTBEAT_S": 0.3, "GATEWAY_LEDGER_SPOOL_DIR": str(rdir / "spool"),
        "QDRANT_PATH": str(rdir / "qdrant")}), env={"SLUICE_PROVIDER_KEY_FRONTIER": FRONTIER_KEY},
        log_dir=rdir)
    reserved = rb.reserved_key(ns, world.tenant.id, rb.current_period())
    answered, results = set(), []
    try:
        url = gw.url + "/v1/chat/completions"
        for i in range(5):
            status, rid, ok = _post(url, world.key, f"before {i}")
            assert ok
            answered.add(rid)
        wait_for(lambda: int(r.get(reserved) or 0) == 0, what="the first requests settled")
        # streams that hold budget across the restart: their settle meets Redis down
        slow = [threading.Thread(target=lambda i=i: results.append(_post(
            url, world.key, f"across {i} a b c [[chunk-delay:250]]", stream=True)))
            for i in range(4)]
        for t in slow:
            t.start()
        wait_for(lambda: int(r.get(reserved) or 0) > 0, what="holds of the slow streams")
        held_before = int(r.get(reserved))
        procs[0].kill()
        procs[0].wait(10)
        during = [_post(url, world.key, f"during {i}") for i in range(5)]
        for t in slow:
            t.join(30)
        health = httpx.get(gw.url + "/healthz").json()
        waiting, spooled = health["budget_unsettled"], health["ledger_backlog"]
        procs.append(start_redis(port, rdir))  # the same append-only file
        wait_for(lambda: httpx.get(gw.url + "/healthz").json()["ledger_backlog"] == 0
                 and httpx.get(gw.url + "/healthz").json()["budget_unsettled"] == 0,
                 timeout=20, what="backlog written and settles retried")
        for status, rid, ok in during + results:
            assert ok, "a request failed while Redis was down"
            answered.add(rid)
        held_after = int(r.get(reserved) or 0)
        live = leases.live_holds(r, k).get(reserved, 0)
    finally:
        gw.stop()
    other = create_app({**app_config, "REDIS_URL": url_r, "REDIS_NAMESPACE": ns}, env="test")
    with other.app_context():
        drain_stream(max_batches=50)
    ids = request_ids(world.tenant.id)
    counts = ledger_counts(world.tenant.id)
    report("Redis restarted", requests=len(answered), answered=len(answered),
           held_micro_before_restart=held_before, settles_waiting_during=waiting,
           events_queued_during=spooled, reserved_micro_after=held_after,
           live_holds_micro=live, ledger_rows=counts["rows"],
           lost=len(answered - set(ids)), duplicates=counts["rows"] - counts["distinct"])
    assert held_before > 0 and waiting > 0 and spooled > 0
    assert held_after == live == 0
    assert answered == set(ids) and counts["rows"] == counts["distinct"] == 14
