"""A gateway SIGKILLed mid-stream with budget holds outstanding: every answered request
has exactly one ledger row once the next gateway on the host has sent the dead one's
spool on, and the dead instance's holds go back to 0 (the next gateway's start reaps
them); the reserved counter equals the live holds before and after."""
from __future__ import annotations

import json
import threading
import time

import httpx

from app.contract import budget as rb
from app.contract import leases
from app.redis_client import get_redis, keys
from tests.gateway.conftest import FRONTIER_KEY, Server, health, make_world, wait_for
from tests.robustness.faults import ledger_counts, report, request_ids

QUICK, SLOW = 6, 6


def _gateway(app_config, spool, log_dir, linger_s: float) -> Server:
    cfg = {"REDIS_URL": app_config["REDIS_URL"], "REDIS_NAMESPACE": app_config["REDIS_NAMESPACE"],
           "GATEWAY_SNAPSHOT_POLL_S": 0.1, "GATEWAY_LEDGER_SPOOL_DIR": str(spool),
           "GATEWAY_LEDGER_LINGER_S": linger_s, "GATEWAY_HEARTBEAT_S": 0.3,
           "QDRANT_PATH": str(log_dir / "qdrant")}
    return Server("gateway", json.dumps(cfg), env={"SLUICE_PROVIDER_KEY_FRONTIER": FRONTIER_KEY},
                  log_dir=log_dir)


def _stream(url: str, key: str, i: int, started: threading.Event, out: dict) -> None:
    body = {"model": "tier-1", "stream": True, "messages": [
        {"role": "user", "content": f"slow stream {i} one two three four [[chunk-delay:400]]"}]}
    try:
        with httpx.stream("POST", url, json=body, timeout=30,
                          headers={"authorization": f"Bearer {key}"}) as r:
            out["rid"] = r.headers.get("x-sluice-request-id")
            raw = b""
            for chunk in r.iter_bytes():
                raw += chunk
                started.set()
        out["complete"] = raw.rstrip().endswith(b"data: [DONE]")
    except httpx.HTTPError as exc:
        out["complete"], out["error"] = False, type(exc).__name__
    finally:
        started.set()


def test_gateway_killed_mid_stream_with_holds_outstanding(app, app_config, gateway, fake_replicas,
                                                          frontier, tmp_path):
    world = make_world(app, gateway, [s.url for s in fake_replicas], frontier.url)
    r, k, tid = get_redis(), keys(), world.tenant.id
    reserved = rb.reserved_key(k.ns, tid, rb.current_period())
    spool = tmp_path / "spool"
    # A long linger keeps every answered event in the spool until the kill: the test
    # proves the spool path rather than racing the batch writer.
    victim = _gateway(app_config, spool, tmp_path, linger_s=30.0)
    url = victim.url + "/v1/chat/completions"
    answered: set[str] = set()
    slow: list[dict] = []
    try:
        wait_for(lambda: health(victim)["snapshot_version"], what="victim snapshot")
        instance = health(victim)["instance"]
        for i in range(QUICK):
            resp = httpx.post(url, json={"model": "tier-1", "messages": [
                {"role": "user", "content": f"quick {i}"}]}, timeout=30,
                headers={"authorization": f"Bearer {world.key}"})
            assert resp.status_code == 200
            answered.add(resp.headers["x-sluice-request-id"])
        threads = []
        for i in range(SLOW):
            started, out = threading.Event(), {}
            slow.append(out)
            t = threading.Thread(target=_stream, args=(url, world.key, i, started, out))
            t.start()
            threads.append((t, started))
        for _, started in threads:
            assert started.wait(20)
        holds_key = k.budget_holds(instance)
        wait_for(lambda: r.hlen(holds_key) == SLOW, what="the streams' holds")
        held = leases.live_holds(r, k).get(reserved, 0)
        victim.kill()  # SIGKILL mid-stream: no shutdown hook runs
        for t, _ in threads:
            t.join(30)
    finally:
        victim.stop()
    in_counter = int(r.get(reserved) or 0)
    assert held > 0 and in_counter == held, "reserved must equal the live holds"
    assert not any(s.get("complete") for s in slow), "the streams should have been cut"

    time.sleep(0.3 * leases.HEARTBEAT_TTL_FACTOR + 0.2)  # the dead one's heartbeat expires
    heir = _gateway(app_config, spool, tmp_path, linger_s=0.02)
    try:  # its start reaped the dead instance's holds and adopted its spool
        after_reap = int(r.get(reserved) or 0)
        recovered = health(heir)["ledger_recovered"]
        wait_for(lambda: health(heir)["ledger_written"] >= recovered, what="spool sent on")
    finally:
        heir.stop()
    from app.ledger.service import drain_stream
    drain_stream(max_batches=50)
    ids = request_ids(tid)
    counts = ledger_counts(tid)
    lost = answered - set(ids)
    report("gateway killed mid-stream", requests=QUICK + SLOW, answered=len(answered),
           cut_mid_stream=SLOW, spool_recovered=recovered, ledger_rows=counts["rows"],
           lost=len(lost), duplicates=counts["rows"] - counts["distinct"])
    report("gateway killed with holds outstanding", holds_at_kill=SLOW, held_micro=held,
           reserved_micro_at_kill=in_counter, reserved_micro_after_reap=after_reap,
           holds_left=r.hlen(holds_key),
           instance_forgotten=not r.sismember(k.gateway_instances(), instance))
    assert not lost and counts["rows"] == counts["distinct"]
    assert after_reap == 0 and r.hlen(holds_key) == 0
    assert not r.sismember(k.gateway_instances(), instance)
    assert not list(spool.glob("ledger-*.spool")), "a clean stop leaves no spool behind"


def test_stop_flushes_and_closes_even_when_a_loop_ignores_its_cancel(app_config, tmp_path):
    """A background loop whose cancellation is swallowed below it (seen under load: the
    heartbeat's and the snapshot poller's Redis calls left the task "cancelling" and
    looping) used to keep ``stop`` waiting for ever, so the process was killed before its
    ledger was flushed and its spool closed, and the spool stayed behind. ``stop`` now waits
    a bounded time for its loops, then flushes and closes."""
    import asyncio

    from app.gateway import asgi
    from config import load_config

    spool = tmp_path / "spool"
    cfg = load_config("test", overrides={
        "REDIS_URL": app_config["REDIS_URL"], "REDIS_NAMESPACE": app_config["REDIS_NAMESPACE"],
        "GATEWAY_LEDGER_SPOOL_DIR": str(spool), "QDRANT_PATH": str(tmp_path / "qdrant"),
        "GATEWAY_CACHE_WARM": False})

    async def stubborn() -> None:   # what such a loop does: it outlives stop's cancel
        swallowed = 0
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                swallowed += 1
                if swallowed > 1:   # the test's own cancel below ends it
                    raise

    async def scenario() -> tuple[float, list]:
        gw = asgi.Gateway(cfg)
        await gw.start()
        gw._tasks.append(asyncio.create_task(stubborn()))
        assert list(spool.glob("ledger-*.spool"))   # this process's spool is open
        started = time.perf_counter()
        await asyncio.wait_for(gw.stop(), timeout=60)
        left = list(spool.glob("ledger-*.spool"))
        for t in gw._tasks:
            t.cancel()
        return time.perf_counter() - started, left

    took, left = asyncio.run(scenario())
    assert not left, "a clean stop leaves no spool behind"
    assert took >= asgi.STOP_TASKS_S   # it did wait for the loops, then went on
